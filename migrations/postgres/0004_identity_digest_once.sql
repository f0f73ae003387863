-- idemstore PostgreSQL schema, version 4: the identity digest computed once per call.
--
-- Version 2 made id a stored generated column over idemstore_id, a LANGUAGE sql function.
-- That function cannot be inlined (it is declared IMMUTABLE around convert_to, which is only
-- STABLE), so PostgreSQL ran it through its SQL-function executor, parsing and planning its
-- body again on every call: about 50 us, three times per reserve and complete (the generated
-- column, reserve's own lookup, complete's WHERE). That was more than the writes themselves:
-- under 32 concurrent first executions the store managed about 0.65 of a bare INSERT +
-- UPDATE's throughput.
--
-- Now reserve and complete compute the digest themselves, as a PL/pgSQL expression (planned
-- once per session), and id becomes a plain column that reserve fills from the digest it
-- computes anyway (only reserve inserts rows). idemstore_id, which the other statements
-- still call, is PL/pgSQL too. The expression is the one of version 2, so every existing row
-- is found as before.
-- DROP EXPRESSION keeps every stored id and rewrites nothing.
--
-- {{schema}} is replaced by the store's quoted schema name before this file runs.

CREATE OR REPLACE FUNCTION {{schema}}.idemstore_id(p_scope text, p_key text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
    RETURN sha256(convert_to(p_scope, 'UTF8') || '\x00'::bytea || convert_to(p_key, 'UTF8'));
END;
$$;

ALTER TABLE {{schema}}.idemstore_records ALTER COLUMN id DROP EXPRESSION;

-- reserve as in version 2, but for the id it now inserts itself.
CREATE OR REPLACE FUNCTION {{schema}}.idemstore_reserve(
    p_lock bigint,
    p_scope text,
    p_key text,
    p_fingerprint text,
    p_token text,
    p_lease_ttl double precision,
    p_retention double precision
) RETURNS {{schema}}.idemstore_reservation
LANGUAGE plpgsql
AS $$
DECLARE
    r {{schema}}.idemstore_records%ROWTYPE;
    v_now timestamptz := clock_timestamp();
    v_takeover boolean := false;
    v_verdict text;
    -- idemstore_id's digest, written out: a nested function call costs more than the digest.
    v_id bytea := sha256(convert_to(p_scope, 'UTF8') || '\x00'::bytea || convert_to(p_key, 'UTF8'));
BEGIN
    -- First claim of an absent key: the primary key arbitrates racing inserts (a loser waits
    -- for the winner's commit, then inserts nothing). On an existing row this writes nothing.
    INSERT INTO {{schema}}.idemstore_records
           (id, scope, key, fingerprint, status, released, token, fence, response,
            created_at, expires_at, lease_expires_at)
    VALUES (v_id, p_scope, p_key, p_fingerprint, 'in_progress', false, p_token, 1, NULL,
            v_now, v_now + make_interval(secs => p_retention),
            v_now + make_interval(secs => p_lease_ttl))
    ON CONFLICT (id) DO NOTHING
    RETURNING * INTO r;
    IF FOUND THEN
        RETURN ROW('acquired'::text, false, r.fingerprint, r.status, r.token, r.fence,
                   NULL::bytea,
                   extract(epoch FROM r.created_at)::float8,
                   extract(epoch FROM r.expires_at)::float8,
                   extract(epoch FROM r.lease_expires_at)::float8);
    END IF;

    -- The key exists. A live record this request may not take (a replay, a duplicate of
    -- running work, a mismatch) is answered from a plain read: no lock, no write. This is why
    -- a replay writes nothing.
    SELECT * INTO r FROM {{schema}}.idemstore_records
     WHERE id = v_id;
    IF FOUND AND NOT r.released AND r.expires_at > v_now THEN
        IF r.fingerprint <> p_fingerprint THEN
            v_verdict := 'mismatch';
        ELSIF r.status = 'completed' THEN
            v_verdict := 'completed';
        ELSIF r.lease_expires_at > v_now THEN
            v_verdict := 'in_progress';
        END IF;
        IF v_verdict IS NOT NULL THEN
            RETURN ROW(v_verdict, false, r.fingerprint, r.status, r.token, r.fence, r.response,
                       extract(epoch FROM r.created_at)::float8,
                       extract(epoch FROM r.expires_at)::float8,
                       CASE WHEN r.status = 'in_progress'
                            THEN extract(epoch FROM r.lease_expires_at)::float8 END);
        END IF;
    END IF;

    -- Check-then-take-over path (lapsed lease, released tombstone, row past retention):
    -- whoever holds the lock decides from the newest committed row.
    PERFORM pg_advisory_xact_lock(p_lock);
    LOOP
        v_now := clock_timestamp();
        -- FOR UPDATE: complete/release/extend/delete do not take the advisory lock; the row
        -- lock makes us see their outcome and keeps them out until we commit.
        SELECT * INTO r FROM {{schema}}.idemstore_records
         WHERE id = v_id
           FOR UPDATE;
        IF NOT FOUND THEN
            -- Deleted (by delete or sweep) since we looked: claim it afresh; should a
            -- first-claim insert win meanwhile, look again.
            INSERT INTO {{schema}}.idemstore_records
                   (id, scope, key, fingerprint, status, released, token, fence, response,
                    created_at, expires_at, lease_expires_at)
            VALUES (v_id, p_scope, p_key, p_fingerprint, 'in_progress', false, p_token, 1, NULL,
                    v_now, v_now + make_interval(secs => p_retention),
                    v_now + make_interval(secs => p_lease_ttl))
            ON CONFLICT (id) DO NOTHING
            RETURNING * INTO r;
            EXIT WHEN FOUND;
            CONTINUE;
        END IF;
        IF NOT r.released AND r.expires_at > v_now THEN
            -- Re-check what the fast path saw: another acquirer may have won meanwhile.
            IF r.fingerprint <> p_fingerprint THEN
                v_verdict := 'mismatch';
            ELSIF r.status = 'completed' THEN
                v_verdict := 'completed';
            ELSIF r.lease_expires_at > v_now THEN
                v_verdict := 'in_progress';
            END IF;
            IF v_verdict IS NOT NULL THEN
                RETURN ROW(v_verdict, false, r.fingerprint, r.status, r.token, r.fence,
                           r.response,
                           extract(epoch FROM r.created_at)::float8,
                           extract(epoch FROM r.expires_at)::float8,
                           CASE WHEN r.status = 'in_progress'
                                THEN extract(epoch FROM r.lease_expires_at)::float8 END);
            END IF;
            -- Live, in progress, same fingerprint, lease lapsed: a takeover.
            v_takeover := true;
        END IF;
        -- Takeover, re-claim after release, or reuse of a row past retention: the fence
        -- continues from the row so every lease ever handed out for the key stays fenced out.
        UPDATE {{schema}}.idemstore_records
           SET fingerprint = p_fingerprint,
               status = 'in_progress',
               released = false,
               token = p_token,
               fence = r.fence + 1,
               response = NULL,
               created_at = v_now,
               expires_at = v_now + make_interval(secs => p_retention),
               lease_expires_at = v_now + make_interval(secs => p_lease_ttl)
         WHERE id = v_id
        RETURNING * INTO r;
        EXIT;
    END LOOP;
    RETURN ROW('acquired'::text, v_takeover, r.fingerprint, r.status, r.token, r.fence,
               NULL::bytea,
               extract(epoch FROM r.created_at)::float8,
               extract(epoch FROM r.expires_at)::float8,
               extract(epoch FROM r.lease_expires_at)::float8);
END;
$$;

-- complete as in version 3, with the digest written out as in reserve.
CREATE OR REPLACE FUNCTION {{schema}}.idemstore_complete(
    p_scope text,
    p_key text,
    p_token text,
    p_fence bigint,
    p_response bytea,
    p_retention double precision,
    p_channel text,
    p_lock bigint
) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_watched boolean;
    v_id bytea := sha256(convert_to(p_scope, 'UTF8') || '\x00'::bytea || convert_to(p_key, 'UTF8'));
BEGIN
    UPDATE {{schema}}.idemstore_records
       SET status = 'completed',
           response = p_response,
           lease_expires_at = NULL,
           expires_at = clock_timestamp() + make_interval(secs => p_retention)
     WHERE id = v_id
       AND token = p_token AND fence = p_fence
       AND status = 'in_progress' AND NOT released
       AND expires_at > clock_timestamp()
    RETURNING watched INTO v_watched;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_watched THEN
        -- Delivered at commit, to waiters listening on this schema's channel.
        PERFORM pg_notify(p_channel, p_lock::text);
    END IF;
    RETURN true;
END;
$$;

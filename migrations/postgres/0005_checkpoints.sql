-- idemstore PostgreSQL schema, version 5: recovery points.
--
-- Each record keeps the checkpoints its owners recorded (Execution.checkpoint), as
-- concatenated self-delimiting entries (idemstore.recovery_points), so recording one is an
-- append inside the fenced UPDATE of idemstore_checkpoint. Existing records get NULL: no
-- checkpoints, read as before. reserve returns them (a takeover resumes from them; a replay
-- shows them) and clears them on any acquisition but a takeover; wait's read returns them.
-- Only the functions that change are defined here.
--
-- {{schema}} is replaced by the store's quoted schema name before this file runs.

ALTER TABLE {{schema}}.idemstore_records ADD COLUMN checkpoints bytea;

ALTER TYPE {{schema}}.idemstore_reservation ADD ATTRIBUTE checkpoints bytea;

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
                   extract(epoch FROM r.lease_expires_at)::float8,
                   NULL::bytea);
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
                            THEN extract(epoch FROM r.lease_expires_at)::float8 END,
                       r.checkpoints);
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
                                THEN extract(epoch FROM r.lease_expires_at)::float8 END,
                           r.checkpoints);
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
               -- Only a takeover resumes the work: any other acquisition starts afresh.
               checkpoints = CASE WHEN v_takeover THEN r.checkpoints END,
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
               extract(epoch FROM r.lease_expires_at)::float8,
               r.checkpoints);
END;
$$;

-- Its result gains a column: a new return type needs the function dropped first.
DROP FUNCTION {{schema}}.idemstore_watch(text, text);

CREATE FUNCTION {{schema}}.idemstore_watch(p_scope text, p_key text)
RETURNS TABLE (
    fingerprint      text,
    status           text,
    token            text,
    fence            bigint,
    response         bytea,
    created_at       double precision,
    expires_at       double precision,
    lease_expires_at double precision,
    now              double precision,
    checkpoints      bytea
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_id bytea := {{schema}}.idemstore_id(p_scope, p_key);
BEGIN
    UPDATE {{schema}}.idemstore_records AS r
       SET watched = true
     WHERE r.id = v_id AND r.status = 'in_progress' AND NOT r.released AND NOT r.watched
       AND r.expires_at > clock_timestamp();
    RETURN QUERY
    SELECT r.fingerprint::text, r.status, r.token, r.fence, r.response,
           extract(epoch FROM r.created_at)::float8,
           extract(epoch FROM r.expires_at)::float8,
           CASE WHEN r.status = 'in_progress'
                THEN extract(epoch FROM r.lease_expires_at)::float8 END,
           extract(epoch FROM clock_timestamp())::float8,
           r.checkpoints
      FROM {{schema}}.idemstore_records AS r
     WHERE r.id = v_id AND NOT r.released AND r.expires_at > clock_timestamp();
END;
$$;

-- checkpoint: append one entry, under the owner check of complete (same token and fence, in
-- progress, not released, within retention), so a fenced-out owner records nothing.
CREATE FUNCTION {{schema}}.idemstore_checkpoint(
    p_scope text,
    p_key text,
    p_token text,
    p_fence bigint,
    p_entry bytea
) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE {{schema}}.idemstore_records
       SET checkpoints = coalesce(checkpoints, ''::bytea) || p_entry
     WHERE id = {{schema}}.idemstore_id(p_scope, p_key)
       AND token = p_token AND fence = p_fence
       AND status = 'in_progress' AND NOT released
       AND expires_at > clock_timestamp();
    RETURN FOUND;
END;
$$;

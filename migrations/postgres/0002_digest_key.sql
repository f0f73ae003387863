-- idemstore PostgreSQL schema, version 2: records keyed by a digest of their identity.
--
-- Version 1 keyed the table by PRIMARY KEY (scope, key). A b-tree entry must fit in a third of
-- a page (2,704 bytes), so an identity within the documented limits (a 1,024-character CJK
-- scope is about 3 KB of UTF-8) could not be stored at all. The key is now id, the SHA-256 of
-- scope, NUL, key (neither can contain NUL, so no two identities share the bytes hashed): 32
-- bytes whatever the identity. scope and key stay columns, returned by every read.
--
-- Existing rows keep working: id is a generated column computed from them, and the functions
-- keep their signatures, so a store that was migrated to version 1 replays its records after
-- this migration. Adding a stored generated column rewrites the table once, under an ACCESS
-- EXCLUSIVE lock: on a large table, run it in a quiet moment.
--
-- {{schema}} is replaced by the store's quoted schema name before this file runs.

-- IMMUTABLE: the bytes of a text value in this database never change, and a generated column
-- and its index need an immutable expression.
CREATE FUNCTION {{schema}}.idemstore_id(p_scope text, p_key text) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT sha256(convert_to(p_scope, 'UTF8') || '\x00'::bytea || convert_to(p_key, 'UTF8'))
$$;

ALTER TABLE {{schema}}.idemstore_records
    ADD COLUMN id bytea GENERATED ALWAYS AS ({{schema}}.idemstore_id(scope, key)) STORED;
ALTER TABLE {{schema}}.idemstore_records DROP CONSTRAINT idemstore_records_pkey;
ALTER TABLE {{schema}}.idemstore_records ADD CONSTRAINT idemstore_records_pkey PRIMARY KEY (id);

-- A live lease keeps its record alive: from now on retention never ends before the lease (the
-- store passes reserve a retention of at least the lease and extend pushes both). Records
-- written by earlier code may still hold a lease past their retention: align them once.
UPDATE {{schema}}.idemstore_records
   SET expires_at = lease_expires_at
 WHERE status = 'in_progress' AND NOT released AND lease_expires_at > expires_at;

-- The functions of version 1, unchanged but for finding the row by id.

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
    v_id bytea := {{schema}}.idemstore_id(p_scope, p_key);
BEGIN
    -- First claim of an absent key: the primary key arbitrates racing inserts (a loser waits
    -- for the winner's commit, then inserts nothing). On an existing row this writes nothing.
    INSERT INTO {{schema}}.idemstore_records
           (scope, key, fingerprint, status, released, token, fence, response,
            created_at, expires_at, lease_expires_at)
    VALUES (p_scope, p_key, p_fingerprint, 'in_progress', false, p_token, 1, NULL,
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
                   (scope, key, fingerprint, status, released, token, fence, response,
                    created_at, expires_at, lease_expires_at)
            VALUES (p_scope, p_key, p_fingerprint, 'in_progress', false, p_token, 1, NULL,
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

-- complete: only the holder (same token AND fence, still in progress, not released, within
-- retention) may store a response. The conditions are re-checked on the newest row version
-- after any concurrent takeover commits, so a stale owner fenced out writes nothing. An
-- expired lease nobody took over still matches: completing late is allowed.
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
BEGIN
    UPDATE {{schema}}.idemstore_records
       SET status = 'completed',
           response = p_response,
           lease_expires_at = NULL,
           expires_at = clock_timestamp() + make_interval(secs => p_retention)
     WHERE id = {{schema}}.idemstore_id(p_scope, p_key)
       AND token = p_token AND fence = p_fence
       AND status = 'in_progress' AND NOT released
       AND expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- Delivered at commit, to waiters listening on this schema's channel.
    PERFORM pg_notify(p_channel, p_lock::text);
    RETURN true;
END;
$$;

-- release: the holder gives the key up. The row stays as a tombstone (see `released`).
CREATE OR REPLACE FUNCTION {{schema}}.idemstore_release(
    p_scope text,
    p_key text,
    p_token text,
    p_fence bigint,
    p_channel text,
    p_lock bigint
) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE {{schema}}.idemstore_records
       SET released = true,
           lease_expires_at = NULL
     WHERE id = {{schema}}.idemstore_id(p_scope, p_key)
       AND token = p_token AND fence = p_fence
       AND status = 'in_progress' AND NOT released
       AND expires_at > clock_timestamp();
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify(p_channel, p_lock::text);
    RETURN true;
END;
$$;

-- delete: remove the row whatever its state; true only if a live record was there.
CREATE OR REPLACE FUNCTION {{schema}}.idemstore_delete(
    p_scope text,
    p_key text,
    p_channel text,
    p_lock bigint
) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_live boolean;
BEGIN
    DELETE FROM {{schema}}.idemstore_records
     WHERE id = {{schema}}.idemstore_id(p_scope, p_key)
    RETURNING (NOT released AND expires_at > clock_timestamp()) INTO v_live;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify(p_channel, p_lock::text);
    RETURN v_live;
END;
$$;

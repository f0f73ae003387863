-- idemstore PostgreSQL schema, version 1: the records table, the sweeper's index, and the
-- functions that make every store operation one round trip.
--
-- {{schema}} is replaced by the store's quoted schema name (?schema=, default public) before
-- this file runs; `idemstore migrate --dry-run URL` prints the result.

-- The schema itself is created by the migration runner, only when missing: CREATE SCHEMA
-- IF NOT EXISTS would need CREATE on the database even for a schema that exists.

CREATE TABLE {{schema}}.idemstore_records (
    -- "C" collation: identity is byte equality, with no locale-dependent folding.
    scope            text COLLATE "C" NOT NULL,
    key              text COLLATE "C" NOT NULL,
    fingerprint      text COLLATE "C" NOT NULL,
    status           text NOT NULL CHECK (status IN ('in_progress', 'completed')),
    -- A released row is a tombstone: no read sees it, but the next acquisition continues its
    -- fence, so a lease handed out before the release can never match again.
    released         boolean NOT NULL DEFAULT false,
    token            text NOT NULL,
    fence            bigint NOT NULL CHECK (fence >= 1),
    response         bytea,
    created_at       timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    lease_expires_at timestamptz,
    PRIMARY KEY (scope, key)
);

-- The sweeper deletes by retention deadline.
CREATE INDEX idemstore_records_expires_at ON {{schema}}.idemstore_records (expires_at);

-- What reserve returns: the outcome, and the record it acquired or found (times as UNIX epoch
-- seconds of the database clock).
CREATE TYPE {{schema}}.idemstore_reservation AS (
    outcome          text,
    takeover         boolean,
    fingerprint      text,
    status           text,
    token            text,
    fence            bigint,
    response         bytea,
    created_at       double precision,
    expires_at       double precision,
    lease_expires_at double precision
);

-- reserve: one atomic step, one round trip.
--
-- p_lock is a 64-bit hash of (schema, scope, key) computed by the client. The primary key stays
-- the authority on identity and arbitrates first claims of an absent key; the
-- transaction-level advisory lock only serialises the check-then-take-over path (lapsed lease,
-- released tombstone, row past retention), so two acquirers never both decide from the same
-- old row. It is released at commit: nothing outlives the transaction, which is what keeps
-- PgBouncer transaction pooling safe.
CREATE FUNCTION {{schema}}.idemstore_reserve(
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
BEGIN
    -- First claim of an absent key: the primary key arbitrates racing inserts (a loser waits
    -- for the winner's commit, then inserts nothing). On an existing row this writes nothing.
    INSERT INTO {{schema}}.idemstore_records
           (scope, key, fingerprint, status, released, token, fence, response,
            created_at, expires_at, lease_expires_at)
    VALUES (p_scope, p_key, p_fingerprint, 'in_progress', false, p_token, 1, NULL,
            v_now, v_now + make_interval(secs => p_retention),
            v_now + make_interval(secs => p_lease_ttl))
    ON CONFLICT (scope, key) DO NOTHING
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
     WHERE scope = p_scope AND key = p_key;
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
         WHERE scope = p_scope AND key = p_key
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
            ON CONFLICT (scope, key) DO NOTHING
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
         WHERE scope = p_scope AND key = p_key
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
CREATE FUNCTION {{schema}}.idemstore_complete(
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
     WHERE scope = p_scope AND key = p_key
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
CREATE FUNCTION {{schema}}.idemstore_release(
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
     WHERE scope = p_scope AND key = p_key
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
CREATE FUNCTION {{schema}}.idemstore_delete(
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
     WHERE scope = p_scope AND key = p_key
    RETURNING (NOT released AND expires_at > clock_timestamp()) INTO v_live;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify(p_channel, p_lock::text);
    RETURN v_live;
END;
$$;

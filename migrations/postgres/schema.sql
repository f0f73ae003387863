-- The live idemstore PostgreSQL schema: what a schema holds after every migration in this
-- folder, written once, for reading. Migrations are the history (how a database got here);
-- this file is the present. tests/test_schema_file.py builds one schema from the migrations
-- and one from this file and fails on any difference, so a new migration updates it too.
--
-- Fresh installs still run the migrations (`idemstore migrate`), which record each file in the
-- versions table `idemstore_migrations` (created by the runner, so not listed here); this file
-- is never run by idemstore.
--
-- {{schema}} stands for the store's quoted schema name, as in the migrations. Function bodies
-- are kept byte for byte as the database stores them (`\sf` shows the same text); everything
-- outside them, comments included, is free to word for a reader.


-- == The records table ======================================================================

-- One row per (scope, key). Times come from the database clock. The column order is the one
-- the migrations produced (id and watched were added later): `SELECT *` and %ROWTYPE see it.
-- No index but the primary key, and room kept on every page (fillfactor): complete rewrites
-- expires_at, and an UPDATE that changes no indexed column and fits on its page is heap-only
-- (HOT), writing no index entry. The sweeper walks the table in TID ranges instead of an index.
CREATE TABLE {{schema}}.idemstore_records (
    -- "C" collation: identity is byte equality, with no locale-dependent folding.
    scope            text COLLATE "C" NOT NULL,
    key              text COLLATE "C" NOT NULL,
    fingerprint      text COLLATE "C" NOT NULL,
    -- 'in_progress' or 'completed'. No CHECK constraint says so: PostgreSQL prepares CHECK
    -- expressions again for every write: the two cost each reserve and complete about 15 us.
    status           text NOT NULL,
    -- A released row is a tombstone: no read sees it, but the next acquisition continues its
    -- fence, so a lease handed out before the release can never match again.
    released         boolean NOT NULL DEFAULT false,
    token            text NOT NULL,
    -- 1 for a new row, one more on each acquisition of an existing one.
    fence            bigint NOT NULL,
    response         bytea,
    created_at       timestamptz NOT NULL,
    -- Retention deadline; a live lease never ends after it (reserve and extend see to that).
    expires_at       timestamptz NOT NULL,
    lease_expires_at timestamptz,
    -- SHA-256 of scope, NUL, key (idemstore_id): 32 bytes whatever the identity's length, so
    -- the primary key fits a b-tree entry. Filled by reserve, the only writer of new rows.
    id               bytea NOT NULL,
    -- Set once a wait has seen the row in progress: complete and release NOTIFY only then.
    watched          boolean NOT NULL DEFAULT false,
    -- Recovery points (Execution.checkpoint): concatenated entries, NULL for none. Kept by a
    -- takeover and by completion; any other acquisition clears them.
    checkpoints      bytea,
    CONSTRAINT idemstore_records_pkey PRIMARY KEY (id)
) WITH (fillfactor = 85);


-- == Identity ===============================================================================

-- The row id of (scope, key). IMMUTABLE: the bytes of a text value in this database never
-- change. reserve and complete write the same expression out instead of calling this (a call
-- costs more than the digest); the other statements call it.
CREATE FUNCTION {{schema}}.idemstore_id(p_scope text, p_key text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
BEGIN
    RETURN sha256(convert_to(p_scope, 'UTF8') || '\x00'::bytea || convert_to(p_key, 'UTF8'));
END;
$$;


-- == reserve ================================================================================

-- What reserve returns: the outcome ('acquired', 'completed', 'in_progress', 'mismatch'),
-- whether the acquisition took over a lapsed lease, and the record it acquired or found
-- (times as UNIX epoch seconds of the database clock).
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
    lease_expires_at double precision,
    checkpoints      bytea
);

-- One atomic step, one round trip. p_lock is a 64-bit hash of (schema, scope, key) computed by
-- the client. The primary key arbitrates first claims of an absent key; the transaction-level
-- advisory lock only serialises the check-then-take-over path (lapsed lease, released
-- tombstone, row past retention), so two acquirers never decide from the same old row. It is
-- released at commit, which keeps PgBouncer transaction pooling safe.
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


-- == Waiting ================================================================================

-- The read of every wait: marks the row watched while it is in progress (so complete and
-- release will NOTIFY), then returns the live record read after the mark, with the database
-- clock. No waiter is missed: a complete that commits before the mark is seen by this read; one
-- that commits after re-reads the row and sees the mark.
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


-- == Settling a lease =======================================================================
--
-- complete and release succeed only for the holder: same token and fence, still in progress,
-- not released, within retention. The conditions are re-checked on the newest row version
-- after any concurrent takeover commits, so a fenced-out owner writes nothing. Each NOTIFYs
-- the schema's channel (delivered at commit) only for a watched row: notifying commits
-- serialise on one global lock, so a NOTIFY nobody waits for costs throughput.

-- complete: store the response. An expired lease nobody took over still matches (completing
-- late is allowed).
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

-- release: the holder gives the key up; the row stays as a tombstone (see `released`).
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
DECLARE
    v_watched boolean;
BEGIN
    UPDATE {{schema}}.idemstore_records
       SET released = true,
           lease_expires_at = NULL
     WHERE id = {{schema}}.idemstore_id(p_scope, p_key)
       AND token = p_token AND fence = p_fence
       AND status = 'in_progress' AND NOT released
       AND expires_at > clock_timestamp()
    RETURNING watched INTO v_watched;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_watched THEN
        PERFORM pg_notify(p_channel, p_lock::text);
    END IF;
    RETURN true;
END;
$$;


-- checkpoint: append one recovery point (entries are self-delimiting), under the owner check
-- of complete, so a fenced-out owner records nothing.
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


-- == Deleting ===============================================================================

-- delete: remove the row whatever its state; true only if a live record was there. Unlike
-- complete and release, it notifies whether or not the row was watched.
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
     WHERE id = {{schema}}.idemstore_id(p_scope, p_key)
    RETURNING (NOT released AND expires_at > clock_timestamp()) INTO v_live;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify(p_channel, p_lock::text);
    RETURN v_live;
END;
$$;

-- idemstore PostgreSQL schema, version 3: a NOTIFY only where a waiter can exist.
--
-- Until now every complete and release ran pg_notify. PostgreSQL serialises the commits of
-- notifying transactions on one global lock (the notification queue is written at commit), so
-- under many concurrent completions the notification, not the write, set the pace: at 32
-- workers an UPDATE alone committed about 5,800 times a second, with pg_notify about 3,500.
--
-- A row is now `watched` once a wait has seen it in progress (idemstore_watch, the read every
-- wait makes). complete and release notify only for a watched row. No waiter is missed: the
-- wait marks the row before it sleeps, and a complete that commits before the mark is seen
-- by the wait's next read (it reads again right after subscribing); one that commits after
-- reads the mark, because its UPDATE re-reads the newest row version. A waiter of a version
-- before this one does not mark rows: it is woken by its polling (at most PUSH_RECHECK late)
-- until it runs this version.
--
-- Adding a column with a constant default rewrites nothing (PostgreSQL 11 and later).
--
-- {{schema}} is replaced by the store's quoted schema name before this file runs.

ALTER TABLE {{schema}}.idemstore_records
    ADD COLUMN watched boolean NOT NULL DEFAULT false;

-- The read of a wait: marks the row watched while it is in progress (writing nothing once it
-- is), then returns the live record, read after the mark (a new snapshot: a complete that the
-- mark waited for is seen), with the database clock.
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
    now              double precision
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
           extract(epoch FROM clock_timestamp())::float8
      FROM {{schema}}.idemstore_records AS r
     WHERE r.id = v_id AND NOT r.released AND r.expires_at > clock_timestamp();
END;
$$;

-- complete and release: as in version 2, but they notify only a watched row.
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
BEGIN
    UPDATE {{schema}}.idemstore_records
       SET status = 'completed',
           response = p_response,
           lease_expires_at = NULL,
           expires_at = clock_timestamp() + make_interval(secs => p_retention)
     WHERE id = {{schema}}.idemstore_id(p_scope, p_key)
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

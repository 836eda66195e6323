-- The change log says each reason once (docs/scaling.md, "Where the bytes go").
--
-- Every change stored its reason and the reason it replaced as text, ~84 bytes a change, yet
-- the reasons are few: dlrfeed's wording of what the evidence says (P7), one per stat, err and
-- kind of basis, repeated across millions of changes. From now on:
-- - dlr.reasons holds each reason text once, under a small integer id. It only grows: an id,
--   once given, names its text for good (the table refuses UPDATE and DELETE), so a reader
--   never needs a lock to resolve one. It stops growing once 100,000 ids are drawn (a few
--   hundred texts are usual: stats times err codes times kinds): a gateway whose err values
--   are unique per message would otherwise make it grow for ever while the log itself is
--   dropped by the day, so past that bound a new text is stored in the change's own row, as
--   before.
-- - The log's rows live in dlr.status_change_rows (the partitioned table, renamed: its days,
--   keys, indexes and privileges go with it). A change written from now on names its reasons
--   by id (reason_id, previous_reason_id) and leaves the texts NULL; a change stored before
--   keeps its texts, and so does a reason longer than a dictionary entry may be (its text is
--   stored in the row, as before).
-- - dlr.status_changes is a view with the log's columns in their order, each reason its text:
--   every reader (`dlrfeed changes`, the follower, the relay, SQL consumers) reads the same
--   answers as before.
-- Locks: ACCESS EXCLUSIVE on dlr.status_changes with its days, held to the commit. Every step is
-- a catalog change (the new columns are NULL, dropping NOT NULL checks nothing, a rename moves
-- no row), so the lock is held for milliseconds whatever the log's size. First, SHARE ROW
-- EXCLUSIVE on dlr.message_status (reads go on, writes wait): a writer whose trigger had to
-- wait for the log would otherwise go on, once the log is renamed, with the old trigger's
-- statement, and fail on the view; this way a writer either finished before or starts after,
-- under the new trigger. lock_timeout bounds the wait for both, as in 0016 and 0017.

SET LOCAL lock_timeout = '5s';

LOCK TABLE dlr.message_status IN SHARE ROW EXCLUSIVE MODE;
LOCK TABLE dlr.status_changes IN ACCESS EXCLUSIVE MODE;

CREATE TABLE dlr.reasons (
    id     integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reason text    NOT NULL UNIQUE,
    -- A B-tree entry must stay under ~2,700 bytes; a longer reason (a very long stat or err) is
    -- kept in the change's own row instead.
    CHECK (octet_length(reason) <= 1000)
);
COMMENT ON TABLE dlr.reasons IS
    'each status reason text once (migration 0018); ids are never reused or changed';

-- An id names its text for good: the dictionary refuses UPDATE, DELETE and TRUNCATE, even from
-- its owner (a changed text would change every change that names it).
CREATE FUNCTION dlr.forbid_reason_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'dlr.reasons only grows: an id names its text for good (migration 0018)'
        USING ERRCODE = 'insufficient_privilege';
END;
$$;
CREATE TRIGGER reasons_append_only
    BEFORE UPDATE OR DELETE ON dlr.reasons
    FOR EACH ROW EXECUTE FUNCTION dlr.forbid_reason_change();
CREATE TRIGGER reasons_no_truncate
    BEFORE TRUNCATE ON dlr.reasons
    FOR EACH STATEMENT EXECUTE FUNCTION dlr.forbid_reason_change();

-- Adds to the dictionary those of `candidates` it lacks and may take (at most 1,000 bytes, while
-- fewer than 100,000 ids were drawn), in sorted order: two writers adding new texts wait on each
-- other in one order. The first statement of a store's first hours, or of new wording, adds
-- something; after that it only looks. A writer in a REPEATABLE READ (or SERIALIZABLE)
-- transaction that meets a text added after its snapshot would fail to serialize on it: it
-- adds nothing instead, and its changes keep such texts in their rows. Run by the trigger
-- function below, as the schema owner.
CREATE FUNCTION dlr.add_reasons(candidates text[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    missing text[];
BEGIN
    SELECT array_agg(c.reason ORDER BY c.reason) INTO missing
    FROM unnest(candidates) AS c (reason)
    WHERE octet_length(c.reason) <= 1000
      AND NOT EXISTS (SELECT 1 FROM dlr.reasons AS r WHERE r.reason = c.reason);
    IF missing IS NULL
       OR coalesce(pg_sequence_last_value('dlr.reasons_id_seq'::regclass), 0) >= 100000 THEN
        RETURN;
    END IF;
    BEGIN
        INSERT INTO dlr.reasons (reason)
        SELECT m.reason FROM unnest(missing) WITH ORDINALITY AS m (reason, n) ORDER BY m.n
        ON CONFLICT (reason) DO NOTHING;
    EXCEPTION WHEN serialization_failure THEN
        NULL;  -- the changes keep these texts in their rows
    END;
END;
$$;
REVOKE ALL ON FUNCTION dlr.add_reasons(text[]) FROM PUBLIC;

ALTER TABLE dlr.status_changes RENAME TO status_change_rows;
ALTER TABLE dlr.status_change_rows
    ALTER COLUMN reason DROP NOT NULL,
    ADD COLUMN reason_id integer,
    ADD COLUMN previous_reason_id integer;
COMMENT ON COLUMN dlr.status_change_rows.reason_id IS
    'dlr.reasons.id of the reason (migration 0018); NULL when the text is in column reason';
COMMENT ON COLUMN dlr.status_change_rows.previous_reason_id IS
    'dlr.reasons.id of the previous reason; NULL when the text is in previous_reason, or none';

-- Every change has its reason, as text or by id: checked on every row written from now on (NOT
-- VALID: the stored rows all have their text, and proving it would read the whole log under
-- the lock).
ALTER TABLE dlr.status_change_rows
    ADD CONSTRAINT status_change_rows_reason_check
    CHECK (reason IS NOT NULL OR reason_id IS NOT NULL) NOT VALID;

-- A reason's text, whether a row holds it or names it by id. LANGUAGE sql and STABLE: inlined
-- into the statement that reads it, as a probe of the dictionary's key. Runs with its caller's
-- privileges (so it reads the dictionary only for those who may), executable by anyone.
CREATE FUNCTION dlr.reason_text(stored text, id integer) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce($1, (SELECT r.reason FROM dlr.reasons AS r WHERE r.id = $2))
$$;

CREATE VIEW dlr.status_changes AS
SELECT c.position, c.changed_at, c.login, c.message_id, c.status, c.is_final,
       dlr.reason_text(c.reason, c.reason_id) AS reason,
       c.supporting_event_id, c.rules_version, c.previous_status, c.previous_is_final,
       dlr.reason_text(c.previous_reason, c.previous_reason_id) AS previous_reason
FROM dlr.status_change_rows AS c;
COMMENT ON VIEW dlr.status_changes IS
    'the status-change log (docs/changes.md), every reason as its text (migration 0018)';

-- The partitions keep their names (status_changes_YYYYMMDD, status_changes_default): only
-- the parent they are created under is named anew.
CREATE OR REPLACE FUNCTION dlr.create_status_change_partitions(through timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql SET timezone = 'UTC' AS $fn$
DECLARE
    day timestamptz;
    name text;
BEGIN
    SELECT coalesce(max(p.upper_bound), date_trunc('day', now())) INTO day
    FROM dlr.day_partitions AS p WHERE p.parent_table = 'status_change_rows';
    WHILE day < through LOOP
        name := 'status_changes_' || to_char(day, 'YYYYMMDD');
        EXECUTE format('CREATE TABLE dlr_partitions.%I PARTITION OF dlr.status_change_rows'
                       ' FOR VALUES FROM (%L) TO (%L)', name, day, day + interval '1 day');
        EXECUTE format('CREATE INDEX %I ON dlr_partitions.%I (login, message_id, position)'
                       ' WHERE status IS NULL', name || '_withdrawn', name);
        RETURN NEXT name;
        day := day + interval '1 day';
    END LOOP;
END;
$fn$;

-- Restated from 0017 on the table rather than the view: the function is inlined into the
-- trigger's statements, and there it must probe the withdrawals' index with the days pruned.
CREATE OR REPLACE FUNCTION dlr.latest_withdrawal(
    login text, message_id text, since timestamptz, before timestamptz)
RETURNS TABLE (epoch numeric)
LANGUAGE sql STABLE AS $$
    SELECT trunc(max(c.position) / 1e19)
    FROM dlr.status_change_rows AS c
    WHERE c.login = $1 AND c.message_id = $2 AND c.status IS NULL
          AND c.changed_at >= $3 AND c.changed_at < $4
$$;

-- Restated from 0017: the same changes at the same positions, their reasons by id. Each branch
-- first adds the texts it will name that the dictionary lacks (dlr.add_reasons: one probe of
-- dlr.reasons' key per distinct text of the statement), then writes the changes joined to it.
-- That second statement takes its own snapshot, so it sees a text another transaction added
-- meanwhile; a text the dictionary still lacks (too long, the dictionary full, or skipped by a
-- REPEATABLE READ writer) is stored in the row itself. A withdrawal's own reason (a
-- recompute's why, rare and free-worded) is stored as text.
CREATE OR REPLACE FUNCTION dlr.record_status_changes() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    own_epoch numeric := pg_current_xact_id()::text::numeric;
    written_at timestamptz := clock_timestamp();
    recent timestamptz := now() - interval '1 hour';
    horizon timestamptz := written_at + interval '1 hour';
    written bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM dlr.add_reasons(ARRAY(SELECT DISTINCT n.reason FROM new_rows AS n));
        INSERT INTO dlr.status_change_rows (
            position, changed_at, login, message_id, status, is_final, reason, reason_id,
            supporting_event_id, rules_version)
        SELECT greatest(own_epoch, n.change_epoch, w.epoch) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, n.login, n.message_id, n.status, n.is_final,
               CASE WHEN r.id IS NULL THEN n.reason END, r.id,
               n.supporting_event_id, n.rules_version
        FROM new_rows AS n
        LEFT JOIN dlr.reasons AS r ON r.reason = n.reason
        LEFT JOIN LATERAL dlr.latest_withdrawal(n.login, n.message_id, recent, horizon) AS w
            ON true;
    ELSIF TG_OP = 'UPDATE' THEN
        -- Only real changes: a rewrite that keeps status, finality and reason writes nothing.
        -- Every text of the rows, changed or not: cheaper than finding the changed rows twice,
        -- and a text added that no change names yet is harmless (the dictionary only grows).
        PERFORM dlr.add_reasons(ARRAY(
            SELECT n.reason FROM new_rows AS n UNION SELECT o.reason FROM old_rows AS o));
        INSERT INTO dlr.status_change_rows (
            position, changed_at, login, message_id, status, is_final, reason, reason_id,
            supporting_event_id, rules_version, previous_status, previous_is_final,
            previous_reason, previous_reason_id)
        SELECT greatest(own_epoch, n.change_epoch, w.epoch) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, n.login, n.message_id, n.status, n.is_final,
               CASE WHEN rn.id IS NULL THEN n.reason END, rn.id,
               n.supporting_event_id, n.rules_version, o.status, o.is_final,
               CASE WHEN ro.id IS NULL THEN o.reason END, ro.id
        FROM new_rows AS n
        JOIN old_rows AS o USING (login, message_id)
        LEFT JOIN dlr.reasons AS rn ON rn.reason = n.reason
        LEFT JOIN dlr.reasons AS ro ON ro.reason = o.reason
        LEFT JOIN LATERAL dlr.latest_withdrawal(n.login, n.message_id, recent, horizon) AS w
            ON true
        WHERE (n.status, n.is_final, n.reason) IS DISTINCT FROM (o.status, o.is_final, o.reason);
    ELSE
        -- DELETE: the status withdrawn (0012). The recompute's audit row of this transaction
        -- (same now()) names why and under which rules.
        PERFORM dlr.add_reasons(ARRAY(SELECT DISTINCT o.reason FROM old_rows AS o));
        INSERT INTO dlr.status_change_rows (
            position, changed_at, login, message_id, status, is_final, reason,
            supporting_event_id, rules_version, previous_status, previous_is_final,
            previous_reason, previous_reason_id)
        SELECT greatest(own_epoch, o.change_epoch, w.epoch) * 1e19
                   + nextval('dlr.status_changes_tick'),
               written_at, o.login, o.message_id, NULL, false,
               coalesce(a.why, 'withdrawn: no computed status any more'),
               o.supporting_event_id, coalesce(a.new_rules_version, o.rules_version),
               o.status, o.is_final, CASE WHEN ro.id IS NULL THEN o.reason END, ro.id
        FROM old_rows AS o
        LEFT JOIN dlr.reasons AS ro ON ro.reason = o.reason
        LEFT JOIN LATERAL dlr.latest_withdrawal(o.login, o.message_id, recent, horizon) AS w
            ON true
        LEFT JOIN LATERAL (
            SELECT r.why, r.new_rules_version FROM dlr.status_recomputations AS r
            WHERE r.login = o.login AND r.message_id = o.message_id AND r.new_status IS NULL
                  AND r.recomputed_at = now()
            ORDER BY r.id DESC LIMIT 1
        ) AS a ON true
        ORDER BY o.login, o.message_id;
    END IF;
    GET DIAGNOSTICS written = ROW_COUNT;
    IF written > 0 THEN
        -- Wakes followers at commit (one notification per transaction: equal ones fold). The
        -- log is the truth; a follower that misses this finds the rows on its next poll.
        PERFORM pg_notify('dlr_status_changes', '');
    END IF;
    RETURN NULL;
END;
$$;

-- Privileges: the rows and the dictionary are written only through the SECURITY DEFINER
-- trigger function; readers read the view (and may read the two tables it shows).
REVOKE ALL ON dlr.reasons, dlr.status_changes FROM PUBLIC;
DO $grants$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dlrfeed_reader') THEN
        GRANT SELECT ON dlr.reasons, dlr.status_changes TO dlrfeed_reader;
    END IF;
END
$grants$;

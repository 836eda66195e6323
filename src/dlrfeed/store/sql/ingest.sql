-- The ingest transaction (dlrfeed.store.ingest), in the order it runs. Set-based statements
-- over whole arrays, so a batch costs a handful of round trips, never one per receipt. Locks
-- are taken in sorted key order, message rows (or, for ids with no message yet, advisory locks)
-- first, event rows second, so concurrent ingests never wait on each other in a cycle.

-- name: lock_messages
-- P10: exact correlation by message id within the login; the row lock serialises every status
-- computation of that message; the planner checks reported times against its submission time
-- (P19). Locked in the order of the sorted :message_ids, one primary-key probe per id: the
-- locking LATERAL subquery cannot be flattened, so no plan can lock them in another order
-- (two batches could deadlock) or hash every message of the login on stale statistics.
SELECT m.message_id, m.submitted_at, m.id
FROM unnest(:message_ids::text[]) WITH ORDINALITY AS k(message_id, position)
CROSS JOIN LATERAL (
    SELECT m.message_id, m.submitted_at, m.id
    FROM dlr.messages AS m
    WHERE m.login = :login AND m.message_id = k.message_id
    FOR NO KEY UPDATE
) AS m
ORDER BY k.position

-- name: lock_correlation_ids
-- Ids with no message yet: an advisory lock per id, in sorted order, so that a concurrent
-- record_submissions either sees our uncorrelated exception or we see its message (late
-- correlation is never missed). The two-int4 form with the namespace 6581362 (0x646C72,
-- "dlr"), so these never collide with the migration lock (one bigint, schema.sql).
SELECT count(pg_advisory_xact_lock(6581362, hashtext(:login || chr(31) || k)))
FROM (SELECT k FROM unnest(:ids::text[]) AS k ORDER BY k) AS sorted

-- name: insert_events_read_statuses
-- One round trip after the message locks, three parts, told apart by `part`:
-- - 'event': P14, insert-or-detect of the batch's keys, (id, message_id, level, by_message) per
--   new event. :events is a JSON array of rows, each an array of an event's fields
--   (ingest.first_events), named and typed once (`keyed`): one JSON parameter instead of
--   eleven arrays, because the driver's per-element array encoding costs more than the
--   server's JSON parse (bench_store). An event whose own id names a recorded message
--   (:own_ids, its row id in :own_refs) goes into dlr.message_events under that row's id, every
--   other one into dlr.event_rows; recording a message moves its events
--   (dlr.move_events_to_messages), so a key is in one table only and each insert detects its
--   repeats by that table's key. The ids are drawn first, in :events order, so that event ids
--   follow arrival whichever table keeps each.
-- - 'held': the planner's state of each correlated message in :correlated (row ids in
--   :correlated_refs), from its status row, and for a message with no status yet the
--   repeat/conflict counts of its earlier, unapplied events. The statement's snapshot is taken
--   after the locks were granted, so every status committed under them is seen; the events
--   this statement inserts are not (the counts are of earlier events, as intended).
-- - 'ids': the id blocks of the batch's receptions (ingest.RECEPTION_ID_BLOCK ids each), drawn
--   under the locks so that reception ids follow each id's arrival order (P19).
WITH
keyed AS (
    SELECT nextval('dlr.events_id_seq') AS id, k.*
    FROM (
        SELECT o.ref, u.r->>0 AS message_id, u.r->>1 AS correlation_id,
               (u.r->>2)::bigint AS level, u.r->>3 AS stat, u.r->>4 AS status, u.r->>5 AS err,
               u.r->>6 AS done_date_raw, (u.r->>7)::timestamptz AS done_at,
               u.r->>8 AS fingerprint, nullif(string_to_array(u.r->>9, ' '), '{}') AS flags,
               to_timestamp((u.r->>10)::float8 / 1000000) AS received_at
        FROM jsonb_array_elements(:events::jsonb) WITH ORDINALITY AS u(r, position)
        LEFT JOIN unnest(:own_ids::text[], :own_refs::bigint[]) AS o(message_id, ref)
            ON o.message_id = u.r->>0
        ORDER BY u.position
    ) AS k
),
new_by_message AS (
    INSERT INTO dlr.message_events (
        id, message_ref, correlation_id, level, stat, status, err, done_date_raw, done_at,
        fingerprint, flags, parser_version, rules_version, first_received_at)
    SELECT u.id, u.ref, u.correlation_id, u.level, u.stat, u.status, u.err, u.done_date_raw,
           u.done_at, u.fingerprint, u.flags, :parser_version, :rules_version, u.received_at
    FROM keyed AS u
    WHERE u.ref IS NOT NULL
    ON CONFLICT (message_ref, level) DO NOTHING
    RETURNING id
),
new_rows AS (
    INSERT INTO dlr.event_rows (
        id, login, message_id, correlation_id, level, stat, status, err, done_date_raw,
        done_at, fingerprint, flags, parser_version, rules_version, first_received_at)
    OVERRIDING SYSTEM VALUE
    SELECT u.id, :login, u.message_id, u.correlation_id, u.level, u.stat, u.status, u.err,
           u.done_date_raw, u.done_at, u.fingerprint, u.flags, :parser_version,
           :rules_version, u.received_at
    FROM keyed AS u
    WHERE u.ref IS NULL
    ON CONFLICT (login, message_id, level) DO NOTHING
    RETURNING id
),
new AS (
    SELECT u.id, u.message_id, u.level, u.ref IS NOT NULL AS by_message
    FROM keyed AS u
    WHERE u.id IN (SELECT id FROM new_by_message UNION ALL SELECT id FROM new_rows)
)
SELECT 'event' AS part, n.id, n.message_id, n.level, n.by_message,
       NULL::text AS status, NULL::bigint AS supporting_event_id, NULL::int AS repeats,
       NULL::int AS conflicts, NULL::int AS progress_events,
       NULL::boolean AS deadline_superseded, NULL::bigint AS supporting_reception_id,
       NULL::bigint AS basis_level, NULL::text AS basis_stat, NULL::text AS basis_err,
       NULL::timestamptz AS basis_done_at, NULL::text[] AS status_flags,
       NULL::int AS orphan_repeats, NULL::int AS orphan_conflicts
FROM new AS n
UNION ALL
SELECT 'held', NULL, k.message_id, NULL, NULL,
       s.status, s.supporting_event_id, s.repeats, s.conflicts, s.progress_events,
       s.deadline_superseded, s.supporting_reception_id, s.basis_level, s.basis_stat,
       s.basis_err, s.basis_done_at, coalesce(s.flags, '{}'),
       o.repeats, o.conflicts
FROM unnest(:correlated::text[], :correlated_refs::bigint[]) AS k(message_id, ref)
-- LATERAL ... OFFSET 0: one primary-key probe per message whatever the statistics say. As a
-- plain join, a batch of a few thousand ids on a store of ~150k statuses gets a merge join that
-- walks the whole primary key (85 ms against 9 ms for 3,000 ids).
LEFT JOIN LATERAL (
    SELECT s.status, s.supporting_event_id, s.repeats, s.conflicts, s.progress_events,
           s.deadline_superseded, s.supporting_reception_id, s.basis_level, s.basis_stat,
           s.basis_err, s.basis_done_at, s.flags
    FROM dlr.statuses AS s
    WHERE s.message_ref = k.ref
    OFFSET 0
) AS s ON true
-- The events of the id while it has no status, each by an equality probe of an index: its own
-- under its message's row id; those correlated to it from another own id (receipt_ids_hex) by
-- each table's partial correlation index.
LEFT JOIN LATERAL (
    SELECT coalesce(sum(x.times_received - 1 - coalesce(cardinality(x.updates), 0)), 0)::int
               AS repeats,
           coalesce(sum(x.conflicting_receptions), 0)::int AS conflicts
    FROM (
        SELECT x.times_received, x.updates, x.conflicting_receptions
        FROM dlr.message_events AS x
        WHERE s.status IS NULL AND x.message_ref = k.ref AND x.correlation_id IS NULL
        UNION ALL
        SELECT x.times_received, x.updates, x.conflicting_receptions
        FROM dlr.event_rows AS x
        WHERE s.status IS NULL AND x.login = :login AND x.correlation_id = k.message_id
          AND x.correlation_id <> x.message_id
        UNION ALL
        SELECT x.times_received, x.updates, x.conflicting_receptions
        FROM dlr.message_events AS x
        JOIN dlr.messages AS m ON m.id = x.message_ref
        WHERE s.status IS NULL AND x.correlation_id = k.message_id
          AND m.login = :login AND m.message_id <> k.message_id
    ) AS x
) AS o ON true
UNION ALL
SELECT 'ids', nextval('dlr.receptions_id_seq'), NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM generate_series(1, :id_blocks::int)

-- name: lock_existing_events
-- Keys already stored, locked (their counters are updated at the end of the transaction; every
-- writer of a key holds its message's lock first, so the lock order cannot make a cycle), with
-- the contents they hold (P14) and the first content's parsed fields, which a reception of the
-- same content leaves to its event. Each key from the table insert_events_read_statuses puts
-- it in: under its message's row id (:refs), or by key in dlr.event_rows where :refs is NULL.
WITH k AS (
    SELECT k.message_id, k.level, k.ref
    FROM unnest(:message_ids::text[], :levels::bigint[], :refs::bigint[])
         AS k(message_id, level, ref)
),
by_message AS (
    SELECT e.id, k.message_id, e.level, e.fingerprint, e.status, e.updates, e.stat, e.err,
           e.done_date_raw, e.done_at, e.flags, e.parser_version, true AS by_message,
           e.later_results, e.conflicting_contents
    FROM k JOIN dlr.message_events AS e ON e.message_ref = k.ref AND e.level = k.level
    FOR NO KEY UPDATE OF e
),
by_key AS (
    SELECT e.id, e.message_id, e.level, e.fingerprint, e.status, e.updates, e.stat, e.err,
           e.done_date_raw, e.done_at, e.flags, e.parser_version, false AS by_message,
           e.later_results, e.conflicting_contents
    FROM k JOIN dlr.event_rows AS e
        ON e.login = :login AND e.message_id = k.message_id AND e.level = k.level
    WHERE k.ref IS NULL
    FOR NO KEY UPDATE OF e
)
SELECT e.id, e.message_id, e.level, e.fingerprint, e.status,
       coalesce(e.updates, '{}') AS updates, e.stat, e.err, e.done_date_raw, e.done_at,
       coalesce(e.flags, '{}') AS flags, e.parser_version, e.by_message,
       coalesce(e.later_results, '{}') AS later_results,
       coalesce(e.conflicting_contents, '{}') AS conflicting_contents
FROM (SELECT * FROM by_message UNION ALL SELECT * FROM by_key) AS e
ORDER BY e.message_id, e.level

-- fragment: upsert_statuses
-- The computed statuses (P7) of the ingest, late correlation and recompute, as WITH items (each
-- ending in a comma): :statuses is a JSON array of rows (rows.status_json), named and typed
-- once here (`status_rows`). Each reason by its id in dlr.reasons (dlr.reason_ids adds the
-- texts it lacks), as text where the dictionary is full. A status with no message row id fails
-- its batch (NOT NULL), which keeps its receipts as unstorable (C8): never dropped.
status_rows AS (
    SELECT (s.r->>0)::bigint AS message_ref, s.r->>1 AS status, (s.r->>2)::boolean AS is_final,
           s.r->>3 AS reason, (s.r->>4)::bigint AS supporting_event_id,
           (s.r->>5)::bigint AS supporting_reception_id, (s.r->>6)::int AS repeats,
           (s.r->>7)::int AS conflicts, (s.r->>8)::int AS progress_events,
           (s.r->>9)::boolean AS deadline_superseded, (s.r->>10)::bigint AS basis_level,
           s.r->>11 AS basis_stat, s.r->>12 AS basis_err,
           (s.r->>13)::timestamptz AS basis_done_at,
           nullif(string_to_array(s.r->>14, ' '), '{}') AS flags
    FROM jsonb_array_elements(:statuses::jsonb) AS s(r)
),
st AS (
    INSERT INTO dlr.statuses (
        message_ref, status, is_final, reason, reason_id, supporting_event_id, repeats,
        conflicts, progress_events, deadline_superseded, rules_version, updated_at,
        supporting_reception_id, basis_level, basis_stat, basis_err, basis_done_at, flags)
    SELECT c.message_ref, c.status, c.is_final, CASE WHEN d.id IS NULL THEN c.reason END,
           d.id, c.supporting_event_id, c.repeats, c.conflicts, c.progress_events,
           c.deadline_superseded, :rules_version, now(), c.supporting_reception_id,
           c.basis_level, c.basis_stat, c.basis_err, c.basis_done_at, c.flags
    FROM status_rows AS c
    LEFT JOIN dlr.reason_ids(ARRAY(SELECT DISTINCT t.reason FROM status_rows AS t)) AS d
        ON d.reason = c.reason
    ON CONFLICT (message_ref) DO UPDATE SET
        status = EXCLUDED.status, is_final = EXCLUDED.is_final, reason = EXCLUDED.reason,
        reason_id = EXCLUDED.reason_id,
        supporting_event_id = EXCLUDED.supporting_event_id, repeats = EXCLUDED.repeats,
        conflicts = EXCLUDED.conflicts, progress_events = EXCLUDED.progress_events,
        deadline_superseded = EXCLUDED.deadline_superseded,
        rules_version = EXCLUDED.rules_version, updated_at = EXCLUDED.updated_at,
        supporting_reception_id = EXCLUDED.supporting_reception_id,
        basis_level = EXCLUDED.basis_level, basis_stat = EXCLUDED.basis_stat,
        basis_err = EXCLUDED.basis_err, basis_done_at = EXCLUDED.basis_done_at,
        flags = EXCLUDED.flags
),

-- fragment: event_counters
-- What write_batch sets on an event (e) from its line (c) of the batch's counters, one
-- text for both event tables. conflicting_receptions counts each conflicting content once, its
-- redeliveries being repeats (P14, C1) counted in times_received. c.updates, c.results and
-- c.conflicting are joined by spaces; an array stays as it is (NULL stays NULL) while nothing
-- is added.
        times_received = e.times_received + c.accepted,
        later_results = CASE WHEN c.results = '' THEN e.later_results
                             ELSE coalesce(e.later_results, '{}')
                                  || string_to_array(c.results, ' ') END,
        conflicting_contents = CASE WHEN c.conflicting = '' THEN e.conflicting_contents
                                    ELSE coalesce(e.conflicting_contents, '{}')
                                         || string_to_array(c.conflicting, ' ') END,
        conflicting_receptions = e.conflicting_receptions + c.conflicts,
        -- NULL while no delivery came after the first.
        last_received_at = nullif(
            greatest(coalesce(e.last_received_at, e.first_received_at),
                     to_timestamp(c.received_at)),
            CASE WHEN e.last_received_at IS NULL THEN e.first_received_at END),
        updates = CASE WHEN c.updates = '' THEN e.updates
                       ELSE coalesce(e.updates, '{}') || string_to_array(c.updates, ' ') END
    FROM unnest(:event_ids::bigint[], :event_accepted::int[], :event_conflicts::int[],
                :event_received_at::float8[], :event_updates::text[],
                :event_by_message::boolean[], :event_results::text[],
                :event_conflicting::text[])
         AS c(id, accepted, conflicts, received_at, updates, by_message, results, conflicting)

-- name: write_batch
-- Everything of the batch but the receptions (copied in by binary COPY, P6/P13): the
-- exceptions, each joined to its reception by batch position p (1-based) within the
-- :id_blocks drawn by insert_events_read_statuses; the new statuses; the events' counters,
-- each event probed in the table that holds it only (:event_by_message, as
-- insert_events_read_statuses and lock_existing_events found it).
WITH exc AS (
    INSERT INTO dlr.exceptions (kind, login, message_id, details, event_id, reception_id)
    SELECT x.kind, :login, x.message_id, x.details::jsonb, x.event_id,
           (:id_blocks::bigint[])[(x.position - 1) / :id_block_size::int + 1]
           + (x.position - 1) % :id_block_size::int
    FROM unnest(:exception_kinds::text[], :exception_message_ids::text[],
                :exception_details::text[], :exception_event_ids::bigint[],
                :exception_positions::int[])
         AS x(kind, message_id, details, event_id, position)
    -- P14/C1: one open conflict per content of a key (exceptions_open_conflict_key), whatever
    -- races; the key layer already makes a redelivery a repeat.
    ON CONFLICT DO NOTHING
),
-- include: upsert_statuses
ev_rows AS (
    UPDATE dlr.event_rows AS e SET
-- include: event_counters
    WHERE e.id = c.id AND NOT c.by_message
),
ev_by_message AS (
    UPDATE dlr.message_events AS e SET
-- include: event_counters
    WHERE e.id = c.id AND c.by_message
)
SELECT 1

-- name: open_unstorable
-- C8: a receipt the database refused, kept as raw bytes in the exceptions queue, unless an open
-- exception holds the same receipt (`evidence_key`): the caller then keeps this delivery's
-- bytes with record_unstorable_redelivery.
INSERT INTO dlr.exceptions (kind, login, message_id, details, evidence, evidence_key)
VALUES ('unstorable', :login, :message_id, :details::jsonb, :evidence, :evidence_key)
ON CONFLICT (login, evidence_key) WHERE kind = 'unstorable' AND resolved_at IS NULL
DO NOTHING
RETURNING id

-- name: record_unstorable_redelivery
-- Another delivery of a receipt with an open `unstorable` exception: its bytes kept too (every
-- delivery is evidence), in a row opened resolved that points to the open one. A new
-- statement, so it sees the open exception that made open_unstorable do nothing; that
-- exception is locked so it stays open until we commit. Returns no row when it was resolved
-- in between (the caller then opens a new one).
INSERT INTO dlr.exceptions (
    kind, login, message_id, details, evidence, evidence_key, resolved_at, resolution)
SELECT 'unstorable', :login, :message_id, :details::jsonb, :evidence, :evidence_key, now(),
       'another delivery of the receipt of open exception ' || o.id
FROM (SELECT x.id FROM dlr.exceptions AS x
      WHERE x.login = :login AND x.evidence_key = :evidence_key AND x.kind = 'unstorable'
        AND x.resolved_at IS NULL
      FOR SHARE) AS o
RETURNING id

-- The sending side (Store.record_submissions) and late correlation: the receipts that
-- arrived before their message was recorded, replayed through the planner.

-- name: insert_messages
-- P5: a message id already recorded is left as it was (idempotent; the caller compares a
-- different record of it, P12). Returns each new message's submission time (P19) and row id.
-- The arrays are the columns of Submission.normalised, in its order.
INSERT INTO dlr.messages (
    login, message_id, internal_id, destination, destination_raw, destination_is_e164, source,
    route, submitted_at, dlr_requested, dlr_level)
SELECT :login, u.message_id, u.internal_id, u.destination, u.destination_raw, u.is_e164,
       u.source, u.route, u.submitted_at, u.dlr_requested, u.dlr_level
FROM unnest(:message_ids::text[], :internal_ids::text[], :destinations::text[],
            :destinations_raw::text[], :destinations_e164::boolean[], :sources::text[],
            :routes::text[], :submitted_at::timestamptz[], :dlr_requested::boolean[],
            :dlr_levels::smallint[])
     AS u(message_id, internal_id, destination, destination_raw, is_e164, source, route,
          submitted_at, dlr_requested, dlr_level)
ORDER BY u.message_id
ON CONFLICT (login, message_id) DO NOTHING
RETURNING message_id, submitted_at, id

-- name: recorded_messages
-- P12: the recorded fields of messages, to compare a second record with
-- (sent_records.RECORD_FIELDS).
SELECT message_id, internal_id, destination_raw, source, route, submitted_at, dlr_requested,
       dlr_level
FROM dlr.messages
WHERE login = :login AND message_id = ANY(:message_ids::text[])

-- name: open_second_records
-- P12: each distinct second record of a sent message id, kept once (evidence_key: a digest of
-- the record) in a `second_record` exception; recording the same file again opens nothing.
INSERT INTO dlr.exceptions (kind, login, message_id, details, evidence_key)
SELECT 'second_record', :login, n.message_id, n.details::jsonb, n.evidence_key
FROM unnest(:message_ids::text[], :details::text[], :evidence_keys::text[])
     AS n(message_id, details, evidence_key)
WHERE NOT EXISTS (
    SELECT 1 FROM dlr.exceptions AS x
    WHERE x.login = :login AND x.message_id = n.message_id AND x.kind = 'second_record'
      AND x.evidence_key = n.evidence_key)

-- name: ids_with_waiting_events
-- Late correlation's first cut: of the ids just recorded, those that may have events waiting.
-- An event waits for its message only if its first delivery opened an `uncorrelated` exception
-- under the receipt's id (P12; resolving it by hand leaves the row), so the small, hot queue
-- answers for nearly every id, where a probe of the events key (the store's largest
-- random-keyed index) reads a random leaf per id. LATERAL ... LIMIT 1: one probe per id of each
-- index (as an EXISTS, a young queue's stale statistics hash the whole login's exceptions on
-- every call: test_growth_plans). Events correlated to k.id from another own id
-- (receipt_ids_hex) are found as waiting_receptions finds them.
SELECT k.id
FROM unnest(:ids::text[]) AS k(id)
CROSS JOIN LATERAL (
    SELECT 1 FROM dlr.exceptions AS x
    WHERE x.login = :login AND x.message_id = k.id AND x.kind = 'uncorrelated'
    UNION ALL
    SELECT 1 FROM dlr.event_rows AS e
    WHERE e.login = :login AND e.correlation_id = k.id AND e.correlation_id <> e.message_id
    UNION ALL
    SELECT 1 FROM dlr.message_events AS e
    CROSS JOIN LATERAL (SELECT m.message_id FROM dlr.messages AS m
                        WHERE m.id = e.message_ref AND m.login = :login OFFSET 0) AS m
    WHERE e.correlation_id = k.id AND e.correlation_id <> m.message_id
    LIMIT 1
) AS waiting

-- name: waiting_receptions
-- Late correlation and recompute: every delivery of the events of each of :correlation_ids,
-- in recorded arrival order (the reception id, P19), with what the planner needs of it.
-- P10: the events of each id (e) by equality probes of an index's leading columns: its own
-- under its message's row id (recording a message moves its events there); those correlated
-- to it from another own id (receipt_ids_hex) by each table's partial correlation index. One
-- OR of the branches would leave the planner a choice: a generic plan made while the tables
-- are young chooses a scan per id, and keeps it while a first drain outgrows autovacuum
-- (test_growth_plans). The events under a message row, each correlated event's message, and
-- each event's receptions by their day's key (event_id, id), in LATERAL ... OFFSET 0: as
-- joins, the estimates of a young dlr.message_events, or of a day partition growing faster
-- than autovacuum analyzes it, favour a hash of the whole table or day per call
-- (test_late_correlation_probes_each_events_receptions_whatever_the_estimates).
-- A reception with a NULL stat takes its parsed fields from its event.
-- P21: an event whose first delivery's day was retired keeps that delivery's content; it comes
-- back as a row of its own (id NULL, at the event's first time), first of its correlation id
-- (retention drops the oldest days). With each row its event's totals, which tell the caller
-- what else retention took.
SELECT r.id, e.id AS event_id, e.message_id, e.correlation_id, e.level,
       coalesce(r.stat, e.stat) AS stat,
       CASE WHEN r.stat IS NULL THEN e.err ELSE r.err END AS err,
       CASE WHEN r.stat IS NULL THEN e.done_date_raw ELSE r.done_date_raw END AS done_date_raw,
       CASE WHEN r.stat IS NULL THEN e.done_at ELSE r.done_at END AS done_at,
       r.received_at,
       CASE WHEN r.stat IS NULL THEN e.fingerprint ELSE r.fingerprint END AS fingerprint,
       CASE WHEN r.stat IS NULL THEN coalesce(e.flags, '{}') ELSE r.flags END AS flags,
       e.times_received, e.conflicting_receptions, coalesce(e.updates, '{}') AS updates,
       coalesce(e.later_results, '{}') AS later_results,
       coalesce(e.conflicting_contents, '{}') AS conflicting_contents
FROM unnest(:correlation_ids::text[]) AS k(correlation_id)
CROSS JOIN LATERAL (
    SELECT e.id, m.message_id, e.level, k.correlation_id, e.stat, e.err, e.done_date_raw,
           e.done_at, e.fingerprint, e.flags,
           e.first_received_at, e.times_received, e.conflicting_receptions, e.updates,
           e.later_results, e.conflicting_contents
    FROM dlr.messages AS m
    CROSS JOIN LATERAL (
        SELECT e.id, e.level, e.stat, e.err, e.done_date_raw, e.done_at, e.fingerprint, e.flags,
           e.first_received_at, e.times_received, e.conflicting_receptions, e.updates,
           e.later_results, e.conflicting_contents
        FROM dlr.message_events AS e
        WHERE e.message_ref = m.id AND e.correlation_id IS NULL
        OFFSET 0
    ) AS e
    WHERE m.login = :login AND m.message_id = k.correlation_id
    UNION ALL
    SELECT e.id, e.message_id, e.level, k.correlation_id, e.stat, e.err, e.done_date_raw,
           e.done_at, e.fingerprint, e.flags,
           e.first_received_at, e.times_received, e.conflicting_receptions, e.updates,
           e.later_results, e.conflicting_contents
    FROM dlr.event_rows AS e
    WHERE e.login = :login AND e.correlation_id = k.correlation_id
      AND e.correlation_id <> e.message_id
    UNION ALL
    SELECT e.id, m.message_id, e.level, k.correlation_id, e.stat, e.err, e.done_date_raw,
           e.done_at, e.fingerprint, e.flags,
           e.first_received_at, e.times_received, e.conflicting_receptions, e.updates,
           e.later_results, e.conflicting_contents
    FROM dlr.message_events AS e
    CROSS JOIN LATERAL (SELECT m.message_id FROM dlr.messages AS m
                        WHERE m.id = e.message_ref AND m.login = :login OFFSET 0) AS m
    WHERE e.correlation_id = k.correlation_id AND e.correlation_id <> m.message_id
) AS e
CROSS JOIN LATERAL (
    SELECT r.id, r.stat, r.err, r.done_date_raw, r.done_at, r.received_at, r.fingerprint,
           r.flags
    FROM dlr.reception_rows AS r
    WHERE r.event_id = e.id
    UNION ALL
    -- The first delivery, retired: no delivery kept as early (1 ms: the event's time and its
    -- reception's are written apart, each rounded to the microsecond).
    SELECT NULL, NULL, NULL, NULL, NULL, e.first_received_at, NULL, NULL
    WHERE NOT EXISTS (
        SELECT 1 FROM dlr.reception_rows AS r
        WHERE r.event_id = e.id
          AND r.received_at <= e.first_received_at + interval '1 millisecond')
    OFFSET 0
) AS r
ORDER BY e.correlation_id, r.id NULLS FIRST, e.id

-- name: lock_open_uncorrelated
-- The open `uncorrelated` exceptions of the events correlated late, locked until
-- write_late_correlation resolves them: one probe of the event_id index per event, kind and
-- resolution checked on the locked (newest) row. LATERAL ... OFFSET 0: the lock alone lets the
-- outer filter in, and on a never-analyzed queue the partial index of open exceptions then
-- wins: the whole open queue read per event (4 s against 0.7 ms for 200 events in a queue of
-- 200k). As one UPDATE joined on the event id, a young queue's estimates likewise hash all of
-- the login's open ones (test_growth_plans).
SELECT o.id, r.resolution
FROM unnest(:event_ids::bigint[], :resolutions::text[]) AS r(event_id, resolution)
CROSS JOIN LATERAL (
    SELECT o.id, o.kind, o.resolved_at
    FROM dlr.exceptions AS o
    WHERE o.event_id = r.event_id
    OFFSET 0
    FOR NO KEY UPDATE
) AS o
WHERE o.kind = 'uncorrelated' AND o.resolved_at IS NULL

-- name: write_late_correlation
-- The statuses computed from the waiting deliveries, the exceptions lock_open_uncorrelated
-- locked resolved, and those the message layer raised on the way. Returns how many resolved.
WITH
-- include: upsert_statuses
resolved AS (
    UPDATE dlr.exceptions AS x SET resolved_at = now(), resolution = r.resolution
    FROM unnest(:exception_ids::bigint[], :resolutions::text[]) AS r(id, resolution)
    WHERE x.id = r.id
    RETURNING x.id
),
opened AS (
    INSERT INTO dlr.exceptions (kind, login, message_id, details, event_id, reception_id)
    SELECT n.kind, :login, n.message_id, n.details::jsonb, n.event_id, n.reception_id
    FROM unnest(:exception_kinds::text[], :exception_message_ids::text[],
                :exception_details::text[], :exception_event_ids::bigint[],
                :exception_reception_ids::bigint[])
         AS n(kind, message_id, details, event_id, reception_id)
)
SELECT count(*) FROM resolved

-- name: commit_without_flush_wait
-- A chunk of record_submissions that is not the call's last commits without waiting for its
-- WAL flush (this transaction only). The last chunk waits for its own flush (and a synchronous
-- standby), and WAL is flushed in order, so that wait covers every earlier chunk: one flush per
-- call, not one per chunk behind the ingest's full-page images (docs/postgresql.md). No durable
-- transaction builds on a chunk lost in a crash (its WAL precedes theirs), and a call that did
-- not return is run again: recording is idempotent. A chunk whose late correlation wrote
-- status changes waits for its flush (P23: a change lost in a crash and written again at
-- another position would reach a billing consumer twice).
SELECT set_config('synchronous_commit', 'off', true)

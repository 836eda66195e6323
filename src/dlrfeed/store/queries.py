"""Every SQL statement of the store, as named constants ($n parameters only, set-based).

Each statement takes whole arrays (`unnest`) so that a batch costs a handful of round trips,
never one per receipt (DESIGN "the ingest transaction"). Locks are always taken in sorted key
order: message rows (or, for ids with no message yet, advisory locks) first, event rows second,
so concurrent ingests never wait on each other in a cycle.
"""

from __future__ import annotations

# Advisory locks of correlation ids use the two-int4 form with this namespace, so they never
# collide with the migration lock (one bigint) of dlrfeed.store.migrate.
CORRELATION_LOCK_NAMESPACE = 0x646C72  # "dlr"


def _upsert_statuses(statuses: str) -> str:
    """The statement body that writes computed statuses (P7), shared by the ingest, the
    late-correlation and the recompute writes: `$1` login, `$2` rules version, `statuses` a
    jsonb array of rows (message_id, status, is_final, reason, supporting_event_id, repeats,
    conflicts, progress_events, deadline_superseded, supporting_reception_id, basis_level,
    basis_stat, basis_err, basis_done_at, flags joined by spaces)."""
    return _STATUS_UPSERT.replace("{statuses}", statuses)


_STATUS_UPSERT = """
    INSERT INTO dlr.message_status (
        login, message_id, status, is_final, reason, supporting_event_id, repeats, conflicts,
        progress_events, deadline_superseded, rules_version, updated_at,
        supporting_reception_id, basis_level, basis_stat, basis_err, basis_done_at, flags)
    SELECT $1, s.r->>0, s.r->>1, (s.r->>2)::boolean, s.r->>3, (s.r->>4)::bigint,
           (s.r->>5)::int, (s.r->>6)::int, (s.r->>7)::int, (s.r->>8)::boolean, $2, now(),
           (s.r->>9)::bigint, (s.r->>10)::bigint, s.r->>11, s.r->>12,
           (s.r->>13)::timestamptz, string_to_array(s.r->>14, ' ')
    FROM jsonb_array_elements({statuses}::jsonb) AS s(r)
    ON CONFLICT (login, message_id) DO UPDATE SET
        status = EXCLUDED.status, is_final = EXCLUDED.is_final, reason = EXCLUDED.reason,
        supporting_event_id = EXCLUDED.supporting_event_id, repeats = EXCLUDED.repeats,
        conflicts = EXCLUDED.conflicts, progress_events = EXCLUDED.progress_events,
        deadline_superseded = EXCLUDED.deadline_superseded,
        rules_version = EXCLUDED.rules_version, updated_at = EXCLUDED.updated_at,
        supporting_reception_id = EXCLUDED.supporting_reception_id,
        basis_level = EXCLUDED.basis_level, basis_stat = EXCLUDED.basis_stat,
        basis_err = EXCLUDED.basis_err, basis_done_at = EXCLUDED.basis_done_at,
        flags = EXCLUDED.flags
"""

# -- name: lock_messages
# P10: exact correlation by message id within the login; the row lock serialises every status
# computation of that message; its submission time is what the planner checks reported times
# against (P19). $2 is sorted (Python order), and the rows are locked in that order, one
# primary-key probe per id: the locking LATERAL subquery cannot be flattened, so
# even a plan made on a young table's stale statistics never hashes every message of the login
# (which cost more than the rest of the batch's reads together; bench_store).
LOCK_MESSAGES = """
SELECT m.message_id, m.submitted_at
FROM unnest($2::text[]) WITH ORDINALITY AS k(message_id, position)
CROSS JOIN LATERAL (
    SELECT m.message_id, m.submitted_at
    FROM dlr.messages AS m
    WHERE m.login = $1 AND m.message_id = k.message_id
    FOR NO KEY UPDATE
) AS m
ORDER BY k.position
"""

# -- name: lock_correlation_ids
# Ids with no message yet: an advisory lock per id, in sorted order, so that a concurrent
# record_submissions either sees our uncorrelated exception or we see its message (late
# correlation is never missed).
LOCK_CORRELATION_IDS = f"""
SELECT count(pg_advisory_xact_lock({CORRELATION_LOCK_NAMESPACE}, hashtext($1 || chr(31) || k)))
FROM (SELECT k FROM unnest($2::text[]) AS k ORDER BY k) AS sorted
"""

# -- name: insert_events_read_statuses
# One round trip after the message locks, three parts:
# - P14: insert-or-detect of logical events, one row per distinct key of the batch in $4 order
#   (the order of each key's first delivery, so event ids follow arrival). $4 is a JSON array
#   of rows [message_id, correlation_id, level, stat, status, err, done_raw, done_at,
#   fingerprint, flags, received_at]: one parameter instead of eleven arrays, because the
#   driver's per-element array encoding costs more than the server's JSON parse (bench_store).
#   Cheap to encode: correlation_id is null when it is the message id (nearly always),
#   received_at integer microseconds (a float costs the JSON encoder a Python call). Returns
#   (id, message_id, level) per new event.
# - The planner's held state of each correlated message in $5, from its status row alone (the
#   basis is kept on the row, migration 0008), and - for messages with no status yet - the
#   repeat/conflict counts of their earlier (unapplied) events. These rows have a NULL id. Read
#   in the statement's snapshot, taken after the locks were granted, so every status committed
#   under those locks is seen; events inserted by this same statement are not (the counts are
#   of earlier events, as intended). Events of a correlation id are found by id where the two
#   are equal, by the partial correlation index where they differ (migration 0005);
#   WAITING_RECEPTIONS reads them the same way.
# - The id blocks of the batch's receptions (migration 0006), drawn here, under the locks, so
#   that reception ids follow the arrival order of each id's deliveries (P19) and the
#   receptions can be copied in as soon as the planner decides each one's outcome.
INSERT_EVENTS_READ_STATUSES = """
WITH new AS (
    INSERT INTO dlr.events (
        login, message_id, correlation_id, level, stat, status, err, done_date_raw, done_at,
        fingerprint, flags, parser_version, rules_version, first_received_at,
        last_received_at)
    SELECT $1, u.r->>0, coalesce(u.r->>1, u.r->>0), (u.r->>2)::bigint, u.r->>3, u.r->>4,
           u.r->>5, u.r->>6, (u.r->>7)::timestamptz, u.r->>8, string_to_array(u.r->>9, ' '),
           $2, $3, to_timestamp((u.r->>10)::float8 / 1000000),
           to_timestamp((u.r->>10)::float8 / 1000000)
    FROM jsonb_array_elements($4::jsonb) WITH ORDINALITY AS u(r, position)
    ORDER BY u.position
    ON CONFLICT (login, message_id, level) DO NOTHING
    RETURNING id, message_id, level
)
SELECT n.id, n.message_id, n.level,
       NULL::text AS status, NULL::bigint AS supporting_event_id, NULL::int AS repeats,
       NULL::int AS conflicts, NULL::int AS progress_events,
       NULL::boolean AS deadline_superseded, NULL::bigint AS supporting_reception_id,
       NULL::bigint AS basis_level, NULL::text AS basis_stat, NULL::text AS basis_err,
       NULL::timestamptz AS basis_done_at, NULL::text[] AS status_flags,
       NULL::int AS orphan_repeats, NULL::int AS orphan_conflicts
FROM new AS n
UNION ALL
SELECT NULL, k.message_id, NULL,
       s.status, s.supporting_event_id, s.repeats, s.conflicts, s.progress_events,
       s.deadline_superseded, s.supporting_reception_id, s.basis_level, s.basis_stat,
       s.basis_err, s.basis_done_at, s.flags,
       o.repeats, o.conflicts
FROM unnest($5::text[]) AS k(message_id)
-- LATERAL ... OFFSET 0: one primary-key probe per id, whatever the table statistics say (a
-- young table's stale statistics otherwise invite a scan of every status of the login).
LEFT JOIN LATERAL (
    SELECT s.status, s.supporting_event_id, s.repeats, s.conflicts, s.progress_events,
           s.deadline_superseded, s.supporting_reception_id, s.basis_level, s.basis_stat,
           s.basis_err, s.basis_done_at, s.flags
    FROM dlr.message_status AS s
    WHERE s.login = $1 AND s.message_id = k.message_id
    OFFSET 0
) AS s ON true
LEFT JOIN LATERAL (
    SELECT coalesce(sum(x.times_received - 1 - cardinality(x.updates)), 0)::int AS repeats,
           coalesce(sum(x.conflicting_receptions), 0)::int AS conflicts
    FROM dlr.events AS x
    WHERE s.status IS NULL AND x.login = $1 AND x.correlation_id = k.message_id
      AND (x.message_id = k.message_id OR x.correlation_id <> x.message_id)
) AS o ON true
UNION ALL
-- The batch's reception id blocks (queries.RECEPTION_ID_BLOCK ids each), $6 of them: rows
-- with a NULL message_id and the block's first id as `id`.
SELECT nextval('dlr.receptions_id_seq'), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM generate_series(1, $6::int)
"""

# -- name: lock_existing_events
# Keys that were already stored: the contents they hold (P14: the first content's fingerprint
# and status, the further accepted fingerprints), rows locked in key order (their counters are
# updated at the end of the transaction).
LOCK_EXISTING_EVENTS = """
SELECT e.id, e.message_id, e.level, e.fingerprint, e.status, e.updates
FROM dlr.events AS e
JOIN unnest($2::text[], $3::bigint[]) AS k(message_id, level)
  ON e.message_id = k.message_id AND e.level = k.level
WHERE e.login = $1
ORDER BY e.message_id, e.level
FOR NO KEY UPDATE OF e
"""

# Reception ids come in blocks of this many consecutive ids, one nextval each: the sequence's
# increment (migration 0006).
RECEPTION_ID_BLOCK = 1000

# -- name: write_batch
# Everything of the batch but the receptions themselves: exceptions (joined to their reception
# by batch position p, 1-based: the reception ids are the blocks $3 drawn by
# INSERT_EVENTS_READ_STATUSES, p getting $3[(p - 1) / RECEPTION_ID_BLOCK + 1] +
# (p - 1) % RECEPTION_ID_BLOCK), the new statuses, the events' counters and accepted contents
# ($14: each event's new fingerprints joined by spaces).
WRITE_BATCH = (
    f"""
WITH exc AS (
    INSERT INTO dlr.exceptions (kind, login, message_id, details, event_id, reception_id)
    SELECT x.kind, $1, x.message_id, x.details::jsonb, x.event_id,
           ($3::bigint[])[(x.position - 1) / {RECEPTION_ID_BLOCK} + 1]
           + (x.position - 1) % {RECEPTION_ID_BLOCK}
    FROM unnest($4::text[], $5::text[], $6::text[], $7::bigint[], $8::int[])
         AS x(kind, message_id, details, event_id, position)
),
st AS (
"""
    + _upsert_statuses("$9")
    + """),
ev AS (
    UPDATE dlr.events AS e SET
        times_received = e.times_received + c.accepted,
        conflicting_receptions = e.conflicting_receptions + c.conflicts,
        last_received_at = greatest(e.last_received_at, to_timestamp(c.received_at)),
        updates = e.updates || string_to_array(c.updates, ' ')
    FROM unnest($10::bigint[], $11::int[], $12::int[], $13::float8[], $14::text[])
         AS c(id, accepted, conflicts, received_at, updates)
    WHERE e.id = c.id
)
SELECT 1
"""
)

# -- name: copy_receptions
# P6/P13: every delivery of the batch, appended by binary COPY with ids from the blocks that
# INSERT_EVENTS_READ_STATUSES drew; the rows are encoded by dlrfeed.store.copy_rows (its
# COLUMNS). `payload` is the evidence, whole; the view dlr.receptions_readable shows it as JSON.
RECEPTIONS_TABLE = "receptions"
RECEPTIONS_SCHEMA = "dlr"

# -- name: open_unstorable
# C8: a receipt the database refused, kept as raw bytes in the exceptions queue - unless an
# open exception already holds the same receipt (`evidence_key`, migration 0004): then nothing,
# and the caller keeps this delivery's bytes with RECORD_UNSTORABLE_REDELIVERY.
OPEN_UNSTORABLE = """
INSERT INTO dlr.exceptions (kind, login, message_id, details, evidence, evidence_key)
VALUES ('unstorable', $1, $2, $3::jsonb, $4, $5)
ON CONFLICT (login, evidence_key) WHERE kind = 'unstorable' AND resolved_at IS NULL
DO NOTHING
RETURNING id
"""

# -- name: record_unstorable_redelivery
# Another delivery of a receipt with an open `unstorable` exception: its bytes kept too (every
# delivery is evidence), in a row opened resolved that points to the open one. A new statement,
# so it sees the open exception that made OPEN_UNSTORABLE do nothing; that exception is locked
# so it stays open until we commit. Returns no row when it was resolved in between (the caller
# then opens a new one).
RECORD_UNSTORABLE_REDELIVERY = """
INSERT INTO dlr.exceptions (
    kind, login, message_id, details, evidence, evidence_key, resolved_at, resolution)
SELECT 'unstorable', $1, $2, $3::jsonb, $4, $5, now(),
       'another delivery of the receipt of open exception ' || o.id
FROM (SELECT x.id FROM dlr.exceptions AS x
      WHERE x.login = $1 AND x.evidence_key = $5 AND x.kind = 'unstorable'
        AND x.resolved_at IS NULL
      FOR SHARE) AS o
RETURNING id
"""

# -- name: insert_messages
# P5: the sending side; a message id already recorded is left as it was (idempotent; a
# different record of it is compared by the caller, P12). Returns each new message with its
# submission time (the planner checks reported times against it, P19).
INSERT_MESSAGES = """
INSERT INTO dlr.messages (
    login, message_id, internal_id, destination, destination_raw, destination_is_e164, source,
    route, submitted_at, dlr_requested, dlr_level)
SELECT $1, u.message_id, u.internal_id, u.destination, u.destination_raw, u.is_e164, u.source,
       u.route, u.submitted_at, u.dlr_requested, u.dlr_level
FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::boolean[], $7::text[],
            $8::text[], $9::timestamptz[], $10::boolean[], $11::smallint[])
     AS u(message_id, internal_id, destination, destination_raw, is_e164, source, route,
          submitted_at, dlr_requested, dlr_level)
ORDER BY u.message_id
ON CONFLICT (login, message_id) DO NOTHING
RETURNING message_id, submitted_at
"""

# -- name: recorded_messages
# P12: the recorded fields of messages, to compare a second record with (rules.RECORD_FIELDS).
RECORDED_MESSAGES = """
SELECT message_id, internal_id, destination_raw, source, route, submitted_at, dlr_requested,
       dlr_level
FROM dlr.messages
WHERE login = $1 AND message_id = ANY($2::text[])
"""

# -- name: open_second_records
# P12: each distinct second record of a sent message id, kept once (evidence_key: a digest of
# the record) in a `second_record` exception; recording the same file again opens nothing.
OPEN_SECOND_RECORDS = """
INSERT INTO dlr.exceptions (kind, login, message_id, details, evidence_key)
SELECT 'second_record', $1, n.message_id, n.details::jsonb, n.evidence_key
FROM unnest($2::text[], $3::text[], $4::text[]) AS n(message_id, details, evidence_key)
WHERE NOT EXISTS (
    SELECT 1 FROM dlr.exceptions AS x
    WHERE x.login = $1 AND x.message_id = n.message_id AND x.kind = 'second_record'
      AND x.evidence_key = n.evidence_key)
"""

# -- name: waiting_receptions
# Late correlation and recompute: every delivery of the events of each correlation id in $2,
# in recorded arrival order (the reception id, P19), with what the planner needs of it. The
# receptions are read by their primary key (login, message_id, ...). P10: the events are found
# per id by two index probes - those whose id is the correlation id, by the unique key; the
# others, by the partial correlation index (migration 0005) - each a plain equality on an
# index's leading columns. One OR of the two would leave the planner a choice: a generic plan
# made while dlr.events was young (statements prepared on an empty database) chose a scan of
# the table per id, and kept it while a first drain grew the table faster than autovacuum
# analyzed it (minutes for 5,000 ids at 400 k events). An equality probe stays the cheapest
# plan at any table size and any statistics.
WAITING_RECEPTIONS = """
SELECT r.id, r.event_id, r.message_id, e.correlation_id, r.level, r.stat, r.err,
       r.done_date_raw, r.done_at, r.received_at, r.fingerprint, r.flags
FROM unnest($2::text[]) AS k(correlation_id)
CROSS JOIN LATERAL (
    SELECT e.id, e.message_id, e.correlation_id
    FROM dlr.events AS e
    WHERE e.login = $1 AND e.message_id = k.correlation_id
      AND e.correlation_id = k.correlation_id
    UNION ALL
    SELECT e.id, e.message_id, e.correlation_id
    FROM dlr.events AS e
    WHERE e.login = $1 AND e.correlation_id = k.correlation_id
      AND e.correlation_id <> e.message_id
) AS e
JOIN dlr.receptions AS r
  ON r.login = $1 AND r.message_id = e.message_id AND r.event_id = e.id
ORDER BY e.correlation_id, r.id
"""

# -- name: write_late_correlation
# The statuses the planner computed from the waiting deliveries, their events' uncorrelated
# exceptions resolved with the reason, and the exceptions the message layer raised on the way
# (joined to their reception by id).
WRITE_LATE_CORRELATION = (
    """
WITH st AS (
"""
    + _upsert_statuses("$3")
    + """),
resolved AS (
    UPDATE dlr.exceptions AS x SET resolved_at = now(), resolution = r.resolution
    FROM unnest($4::bigint[], $5::text[]) AS r(event_id, resolution)
    WHERE x.event_id = r.event_id AND x.kind = 'uncorrelated' AND x.resolved_at IS NULL
    RETURNING x.id
),
opened AS (
    INSERT INTO dlr.exceptions (kind, login, message_id, details, event_id, reception_id)
    SELECT n.kind, $1, n.message_id, n.details::jsonb, n.event_id, n.reception_id
    FROM unnest($6::text[], $7::text[], $8::text[], $9::bigint[], $10::bigint[])
         AS n(kind, message_id, details, event_id, reception_id)
)
SELECT count(*) FROM resolved
"""
)

# -- name: stale_statuses
# Recompute: the next status rows after ($1, $2) in key order, those of another rules version
# unless $4 (every row); $3 rows at most.
STALE_STATUSES = """
SELECT login, message_id
FROM dlr.message_status
WHERE (login, message_id) > ($1, $2) AND ($4 OR rules_version <> $5)
ORDER BY login, message_id
LIMIT $3
"""

# -- name: lock_statuses
# Recompute: the status rows of one login's messages, locked after their messages (the order
# the ingest takes), as they are before the recompute.
LOCK_STATUSES = """
SELECT message_id, status, is_final, reason, supporting_event_id, repeats, conflicts,
       progress_events, deadline_superseded, rules_version
FROM dlr.message_status
WHERE login = $1 AND message_id = ANY($2::text[])
ORDER BY message_id
FOR UPDATE
"""

# -- name: write_recompute
# Recompute: the statuses computed again ($3), those with no applicable receipt under the
# current rules removed ($4), and the audit trail of every change ($5: a jsonb array of rows
# [message_id, old status, old is_final, old reason, old supporting event, old rules version,
# new status, new is_final, new reason, new supporting event, why]).
WRITE_RECOMPUTE = (
    """
WITH st AS (
"""
    + _upsert_statuses("$3")
    + """),
gone AS (
    DELETE FROM dlr.message_status
    WHERE login = $1 AND message_id = ANY($4::text[])
),
audit AS (
    INSERT INTO dlr.status_recomputations (
        login, message_id, old_status, old_is_final, old_reason, old_supporting_event_id,
        old_rules_version, new_status, new_is_final, new_reason, new_supporting_event_id,
        new_rules_version, why)
    SELECT $1, a.r->>0, a.r->>1, (a.r->>2)::boolean, a.r->>3, (a.r->>4)::bigint, a.r->>5,
           a.r->>6, (a.r->>7)::boolean, a.r->>8, (a.r->>9)::bigint, $2, a.r->>10
    FROM jsonb_array_elements($5::jsonb) AS a(r)
)
SELECT 1
"""
)

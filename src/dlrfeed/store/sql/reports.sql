-- The operator's read side (dlrfeed.store.reports: `show`, `exceptions`, `stats`). Only the
-- resolve statements write, and only the resolution columns. The queries of one message's
-- story take the logins as an array, so that every lookup is an index probe per login: the
-- tables are keyed by login first.

-- name: logins
-- Every login with anything stored, for `show` without --login: a loose index scan, each step
-- one probe of each table's (login, ...) index for the next login, so it costs the number of
-- logins, not rows.
WITH RECURSIVE logins(login) AS (
    SELECT min(f.login) FROM (
        SELECT min(login) FROM dlr.events UNION ALL SELECT min(login) FROM dlr.messages
        UNION ALL SELECT min(login) FROM dlr.exceptions
        UNION ALL SELECT min(login) FROM dlr.verifications
    ) AS f(login)
    UNION ALL
    SELECT (SELECT min(n.login) FROM (
                SELECT min(x.login) FROM dlr.events AS x WHERE x.login > l.login
                UNION ALL SELECT min(x.login) FROM dlr.messages AS x WHERE x.login > l.login
                UNION ALL SELECT min(x.login) FROM dlr.exceptions AS x WHERE x.login > l.login
                UNION ALL
                SELECT min(x.login) FROM dlr.verifications AS x WHERE x.login > l.login
            ) AS n(login))
    FROM logins AS l WHERE l.login IS NOT NULL
)
SELECT login FROM logins WHERE login IS NOT NULL

-- name: message_rows
-- The sent message as the sender recorded it (P5), under each login that has it.
SELECT login, message_id, internal_id, destination, destination_raw, destination_is_e164,
       source, route, submitted_at, dlr_requested, dlr_level, recorded_at
FROM dlr.messages
WHERE login = ANY(:logins::text[]) AND message_id = :message_id
ORDER BY login

-- name: status_row
-- The computed status of one message (P7).
SELECT s.status, s.is_final, s.reason, s.supporting_event_id, s.repeats, s.conflicts,
       s.progress_events, s.deadline_superseded, s.rules_version, s.updated_at,
       s.supporting_reception_id, s.flags
FROM dlr.message_status AS s
WHERE s.login = :login AND s.message_id = :message_id

-- name: event_rows
-- Events correlate by correlation_id (the id used to find the message, P10); a receipt that
-- never correlated is found by its own id. Written so that both event indexes serve it: the
-- correlation index holds only ids that differ.
SELECT id, login, level, stat, status, err, done_date_raw, done_at, fingerprint,
       coalesce(flags, '{}') AS flags,
       times_received, conflicting_receptions, parser_version, rules_version,
       first_received_at,
       coalesce(last_received_at, first_received_at) AS last_received_at,  -- NULL: the first
       message_id AS receipt_id
FROM dlr.events
WHERE login = ANY(:logins::text[])
  AND (message_id = :message_id OR (correlation_id = :message_id AND correlation_id <> message_id))
ORDER BY login, level, id

-- name: reception_rows
-- The receptions of those events as dlr.receptions_readable shows them, each event's probed by
-- its day's key (event_id, id).
SELECT id, login, level, stat, err, submit_date_raw, submit_at, done_date_raw, done_at,
       delivery_count, received_at, outcome, flags, event_id, channel::text AS channel, peer,
       payload_json::text AS payload_json
FROM dlr.receptions_readable
WHERE event_id = ANY(:event_ids::bigint[])
ORDER BY received_at, id

-- name: exception_rows_for_message
-- The exceptions opened for the message id or for one of its events (P20).
SELECT id, kind, login, message_id, details::text AS details, event_id, reception_id,
       opened_at, resolved_at, resolution
FROM dlr.exceptions
WHERE login = ANY(:logins::text[])
  AND (message_id = :message_id OR event_id = ANY(:event_ids::bigint[]))
ORDER BY opened_at, id

-- name: list_exceptions
-- The investigation queue, oldest first; a NULL filter is no condition.
SELECT id, kind, login, message_id, details::text AS details, event_id, reception_id,
       opened_at, resolved_at, resolution
FROM dlr.exceptions
WHERE (:kind::text IS NULL OR kind = :kind)
  AND (:login::text IS NULL OR login = :login)
  AND (:include_resolved OR resolved_at IS NULL)
  AND (:opened_before::timestamptz IS NULL OR opened_at <= :opened_before)
  AND (:opened_after::timestamptz IS NULL OR opened_at >= :opened_after)
ORDER BY opened_at, id
LIMIT :limit

-- name: resolve_exception
-- One open exception closed with the operator's note; no row when none open has that id.
UPDATE dlr.exceptions SET resolved_at = now(), resolution = :note
WHERE id = :id AND resolved_at IS NULL
RETURNING id

-- fragment: open_matching
-- The open exceptions a filter picks, as `exceptions --resolve` (by filter) takes them (a NULL
-- filter is no condition). list_exceptions, with the same filters and resolved ones left out,
-- shows the very same rows.
    resolved_at IS NULL
    AND (:kind::text IS NULL OR kind = :kind)
    AND (:login::text IS NULL OR login = :login)
    AND (:opened_before::timestamptz IS NULL OR opened_at <= :opened_before)
    AND (:opened_after::timestamptz IS NULL OR opened_at >= :opened_after)

-- name: count_matching_exceptions
-- What a bulk resolve would take, counted by kind and login, changing nothing.
SELECT kind, login, count(*) AS exceptions, min(opened_at) AS oldest, max(opened_at) AS newest
FROM dlr.exceptions
WHERE
-- include: open_matching
GROUP BY kind, login
ORDER BY kind, login

-- name: resolve_matching_exceptions
-- One statement, so one transaction: every match is resolved with the note, or none is. A row
-- resolved meanwhile by someone else (e.g. late correlation, P12) fails the re-checked
-- `resolved_at IS NULL` and keeps its own resolution. Counted as count_matching_exceptions.
WITH resolved AS (
    UPDATE dlr.exceptions SET resolved_at = now(), resolution = :note
    WHERE
-- include: open_matching
    RETURNING kind, login, opened_at
)
SELECT kind, login, count(*) AS exceptions, min(opened_at) AS oldest, max(opened_at) AS newest
FROM resolved
GROUP BY kind, login
ORDER BY kind, login

-- name: stats_status_counts
-- `stats`: computed statuses by status (C6: what the network reported); NULL login: all.
SELECT status, is_final, count(*) AS messages
FROM dlr.message_status
WHERE (:login::text IS NULL OR login = :login)
GROUP BY status, is_final
ORDER BY is_final DESC, count(*) DESC, status

-- name: stats_submissions
-- `stats`: what the sender recorded (P3), and how much of it has no status yet.
SELECT count(*) AS recorded,
       count(*) FILTER (WHERE s.message_id IS NULL) AS without_status
FROM dlr.messages AS m
LEFT JOIN dlr.message_status AS s USING (login, message_id)
WHERE (:login::text IS NULL OR m.login = :login)

-- name: stats_reception_outcomes
-- `stats`: every delivery by the outcome the rules gave it, and by the path it came by.
SELECT outcome, channel::text AS channel, count(*) AS receptions
FROM dlr.receptions
WHERE (:login::text IS NULL OR login = :login)
GROUP BY outcome, channel
ORDER BY outcome, channel

-- name: stats_event_totals
-- `stats`: logical events, and the deliveries that repeated or contradicted one (P14).
SELECT count(*) AS events,
       coalesce(sum(times_received - 1), 0)::bigint AS repeated_deliveries,
       coalesce(sum(conflicting_receptions), 0)::bigint AS conflicting_deliveries
FROM dlr.events
WHERE (:login::text IS NULL OR login = :login)

-- name: stats_open_exceptions
-- `stats`: the investigation queue by kind, open and in total.
SELECT kind, count(*) FILTER (WHERE resolved_at IS NULL) AS open, count(*) AS total
FROM dlr.exceptions
WHERE (:login::text IS NULL OR login = :login)
GROUP BY kind
ORDER BY kind

-- name: stats_latency
-- DLR latency: the reported done time of the receipt behind a final status minus the time the
-- message was submitted (as recorded by the sender; P19 - reported times, never arrival).
-- `basis_done_at` is that time only when plausible (NULL when absent or implausible). A
-- plausible time may still be up to the clock-skew tolerance (10 minutes) before the
-- submission - SMPP dates are to the minute and the SMSC's clock is not ours -: its latency is
-- clamped to 0 (delivered as soon as sent, as far as the clocks can tell), never negative, and
-- the sample is kept.
SELECT count(*) AS samples,
       percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (
           ORDER BY greatest(extract(epoch FROM s.basis_done_at - m.submitted_at), 0))
           AS seconds
FROM dlr.message_status AS s
JOIN dlr.messages AS m ON m.login = s.login AND m.message_id = s.message_id
WHERE s.is_final AND s.basis_done_at IS NOT NULL AND m.submitted_at IS NOT NULL
  AND (:login::text IS NULL OR s.login = :login)

-- `dlrfeed quality` and the quality section of `dlrfeed stats` (dlrfeed.store.quality): the
-- three facts of C6 kept apart per group - accepted at submit (the sender's record, P3), the
-- status the network reported (P2), and independent verification - with the DLR latencies.

-- name: plan_quality
-- For quality_groups, in its transaction: no JIT, whose compilation the estimates of a week's
-- messages trigger at a cost of seconds, and hash joins rather than merge joins, which would
-- sort the window's messages once per table they meet.
SELECT set_config('jit', 'off', true), set_config('enable_mergejoin', 'off', true)

-- name: quality_groups
-- The report from the raw tables alone (quality_rollup_groups is the same from the rollup), for
-- a done-time threshold that is no bucket boundary. One row per group: the counts, the latencies (seconds; percentiles of the finals with a
-- usable reported done time, P19), the finals by status, and the countries of the group whose
-- verifiable DELIVERED messages (at least :min_messages) were never verified.
-- Below them, the facts: one row per message sent in [since, until), with its group's keys, its computed status, the
-- reported done time and our receive time of the receipt behind it, and whether it was
-- verified (a verification counts when dated at most 24 hours before its message was sent,
-- as in dlr.quality_facts). Everything is read by ranges, never a whole table: the window's messages by the
-- index on the time each was sent; their statuses and events by the range of
-- their row ids (messages are recorded as they are sent, so a window is about one range of
-- the keys dlr.statuses and dlr.message_events are ordered by); their verifications by the
-- time verified (never before the message was sent; 24 hours of clock skew allowed). A status
-- supported by an event correlated from another id (P10) whose own message is not recorded
-- finds that event in dlr.event_rows, by its primary key.
-- The country is looked up by the first four digits of the E.164 destination in the map
-- dlrfeed.store.quality computes once with the phonenumbers library (:countries, a JSON
-- object: one lookup per message, no join).
WITH sent AS MATERIALIZED (
    SELECT m.id, m.login, m.message_id, m.route, coalesce(m.source, '') AS source,
           m.submitted_at, coalesce(m.submitted_at, m.recorded_at) AS sent_at,
           CASE WHEN m.destination_is_e164
                THEN :countries::jsonb ->> substr(m.destination, 2, 4) END AS country
    FROM dlr.messages AS m
    WHERE coalesce(m.submitted_at, m.recorded_at) >= :since
      AND coalesce(m.submitted_at, m.recorded_at) < :until
      AND (:login::text IS NULL OR m.login = :login)
),
ids AS (
    SELECT coalesce(min(id), 0) AS first, coalesce(max(id), -1) AS last FROM sent
),
statuses AS (
    SELECT st.message_ref, st.status, st.is_final, st.basis_err, st.basis_done_at,
           st.supporting_event_id
    FROM dlr.statuses AS st
    WHERE st.message_ref BETWEEN (SELECT first FROM ids) AND (SELECT last FROM ids)
),
events AS (
    SELECT me.id, me.first_received_at
    FROM dlr.message_events AS me
    WHERE me.message_ref BETWEEN (SELECT first FROM ids) AND (SELECT last FROM ids)
),
verified AS (
    SELECT v.login, v.message_id, max(v.verified_at) AS last_verified_at
    FROM dlr.verifications AS v
    WHERE v.verified_at >= :since::timestamptz - interval '24 hours'
      AND (:login::text IS NULL OR v.login = :login)
    GROUP BY v.login, v.message_id
),
facts AS (
    SELECT s.login, s.route, s.source, s.submitted_at, s.sent_at, s.country,
           st.status, coalesce(st.is_final, false) AS is_final,
           st.basis_err AS err, st.basis_done_at AS done_at,
           coalesce(me.first_received_at, er.first_received_at) AS received_at,
           vd.login IS NOT NULL AS verified
    FROM sent AS s
    LEFT JOIN statuses AS st ON st.message_ref = s.id
    LEFT JOIN events AS me ON me.id = st.supporting_event_id
    LEFT JOIN dlr.event_rows AS er ON me.id IS NULL AND er.id = st.supporting_event_id
    LEFT JOIN verified AS vd
        ON vd.login = s.login AND vd.message_id = s.message_id
       AND vd.last_verified_at >= s.sent_at - interval '24 hours'
),
-- Verifiable traffic: the messages of a sender address (login and source) with at least one
-- verification in the window - the kind of message that gets verified (an OTP sender's), not
-- the kind that never is (docs/quality.md).
marked AS MATERIALIZED (
    SELECT CASE :key WHEN 'route' THEN f.route WHEN 'country' THEN f.country ELSE f.err END AS key,
           f.country, f.status, f.is_final, f.sent_at, f.verified,
           f.is_final AND f.status = 'DELIVERED' AS delivered,
           bool_or(f.verified) OVER (PARTITION BY f.login, f.source) AS verifiable,
           extract(epoch FROM f.done_at - f.submitted_at) AS to_done,
           extract(epoch FROM f.received_at - f.submitted_at) AS to_received
    FROM facts AS f
)
, by_status AS (
    SELECT key, jsonb_object_agg(status, messages ORDER BY status)::text AS final_by_status
    FROM (SELECT key, status, count(*) AS messages FROM marked WHERE is_final
          GROUP BY key, status) AS x
    GROUP BY key
),
silent AS (
    SELECT key, array_agg(coalesce(country, '?') ORDER BY delivered DESC, country) AS countries,
           sum(delivered)::bigint AS delivered
    FROM (SELECT key, country,
                 count(*) FILTER (WHERE verifiable AND delivered) AS delivered,
                 count(*) FILTER (WHERE verifiable AND verified) AS verified
          FROM marked GROUP BY key, country) AS d
    WHERE verified = 0 AND delivered >= :min_messages
    GROUP BY key
),
groups AS (
    SELECT key,
           count(*) AS accepted,
           count(*) FILTER (WHERE delivered) AS delivered,
           count(*) FILTER (WHERE is_final AND NOT delivered) AS failed,
           count(*) FILTER (WHERE NOT is_final) AS awaiting,
           count(*) FILTER (WHERE NOT is_final AND sent_at < :cutoff::timestamptz)
               AS pending,
           count(*) FILTER (WHERE verified) AS verified,
           count(*) FILTER (WHERE verified AND NOT delivered) AS verified_without_delivered,
           count(*) FILTER (WHERE verifiable) AS verifiable,
           count(*) FILTER (WHERE verifiable AND delivered) AS verifiable_delivered,
           count(*) FILTER (WHERE verifiable AND verified) AS verifiable_verified,
           count(*) FILTER (WHERE verifiable AND delivered AND NOT verified)
               AS delivered_without_verification,
           count(*) FILTER (WHERE delivered AND to_done IS NOT NULL) AS delivered_with_done_time,
           count(*) FILTER (WHERE delivered AND abs(to_done) < :same_time_seconds)
               AS done_at_submit,
           percentile_cont(ARRAY[0.25, 0.5, 0.75, 0.95, 0.99]) WITHIN GROUP (ORDER BY to_done)
               FILTER (WHERE is_final AND to_done IS NOT NULL) AS to_done,
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY to_received)
               FILTER (WHERE is_final AND to_received IS NOT NULL) AS to_received
    FROM marked
    GROUP BY key
)
SELECT g.*, coalesce(b.final_by_status, '{}') AS final_by_status,
       coalesce(s.countries, '{}') AS silent_countries,
       coalesce(s.delivered, 0) AS silent_delivered
FROM groups AS g
LEFT JOIN by_status AS b ON b.key IS NOT DISTINCT FROM g.key
LEFT JOIN silent AS s ON s.key IS NOT DISTINCT FROM g.key
ORDER BY g.accepted DESC, g.key NULLS LAST

-- name: refresh_quality_hours
-- The rollup up to date, up to :up_to (the clock when NULL): alone (it waits for a refresh
-- already running, then has little left to do), and in a report's transaction, after
-- lock_quality_refresh.
SELECT dlr.refresh_quality_hours(:countries::jsonb, :up_to::timestamptz)

-- name: refresh_built_quality_hours
-- `maintain`, before it drops days of the change log: a rollup that exists reads their changes
-- first (one never built is built whole from the raw tables when first asked).
SELECT dlr.refresh_quality_hours(:countries::jsonb, NULL)
FROM dlr.quality_refresh
WHERE position IS NOT NULL

-- name: quality_rollup_groups
-- quality_groups from the rollup: from dlr.quality_hours, the whole hours in
-- [:hours_from, :hours_to) up to the rollup's frontier (open_from), and the slices of the
-- frontier's hour that end by :until; from the raw tables
-- by dlr.quality_facts, the window's partial first hour (the :raw_from/:raw_to ranges) and
-- the rest, from where the rollup stops to :until. A non-final group of the rollup is pending
-- whole when an hour from its start lies by the deadline's cutoff, in part when the cutoff
-- falls within that hour (by its send times), not at all after. The same counts as
-- quality_groups; the latencies are percentiles of the buckets (dlrfeed.store.quality), and a
-- done time counts as the submission when its bucket lies under :same_time_bucket.
WITH rolled AS (
    SELECT CASE WHEN r.open_from <= :until::timestamptz THEN r.open_from
                -- Else up to the slice that holds :until, raw from its start.
                ELSE coalesce((SELECT max(q.hour) FROM dlr.quality_hours AS q
                               WHERE q.hour >= date_trunc('hour', r.open_from, 'UTC')
                                 AND q.hour <= :until::timestamptz),
                              least(:hours_to::timestamptz, r.open_from)) END AS rolled_to
    FROM dlr.quality_refresh AS r
),
cells AS (
    SELECT q.login, q.source, q.route, q.country, q.err, q.status, q.is_final, q.messages,
           CASE WHEN q.is_final OR q.hour >= c.cutoff THEN 0
                WHEN q.hour + interval '1 hour' <= c.cutoff THEN q.messages
                ELSE (SELECT count(*) FROM unnest(q.awaiting_sent) AS t(sent_at)
                      WHERE t.sent_at < c.cutoff) END AS pending,
           q.verified, q.with_done_time, q.to_done_buckets, q.to_done_counts,
           q.to_received_buckets, q.to_received_counts
    FROM dlr.quality_hours AS q
    CROSS JOIN (SELECT :cutoff::timestamptz AS cutoff) AS c
    CROSS JOIN rolled
    WHERE q.hour >= :hours_from AND q.hour < rolled.rolled_to
      AND (:login::text IS NULL OR q.login = :login)
    UNION ALL
    SELECT f.login, f.source, f.route, f.country, f.err, f.status, f.is_final, f.messages,
           f.pending, f.verified, f.with_done_time, f.to_done_buckets, f.to_done_counts,
           f.to_received_buckets, f.to_received_counts
    FROM (SELECT * FROM unnest(:raw_from::timestamptz[], :raw_to::timestamptz[])
          UNION ALL
          SELECT greatest(rolled.rolled_to, :hours_from), :until FROM rolled
          WHERE greatest(rolled.rolled_to, :hours_from) < :until) AS r(lo, hi)
    CROSS JOIN LATERAL dlr.quality_facts(r.lo, r.hi, :login, :cutoff::timestamptz,
                                         :countries::jsonb, NULL) AS f
),
-- Verifiable traffic: the sender addresses (login and source) with a verification in the window.
senders AS (
    SELECT c.login, c.source FROM cells AS c GROUP BY c.login, c.source HAVING sum(c.verified) > 0
),
marked AS MATERIALIZED (
    SELECT CASE :key WHEN 'route' THEN c.route WHEN 'country' THEN c.country ELSE c.err END AS key,
           c.*, c.is_final AND c.status = 'DELIVERED' AS delivered,
           s.login IS NOT NULL AS verifiable
    FROM cells AS c
    LEFT JOIN senders AS s ON s.login = c.login AND s.source = c.source
),
by_status AS (
    SELECT key, jsonb_object_agg(status, messages ORDER BY status)::text AS final_by_status
    FROM (SELECT key, status, sum(messages) AS messages FROM marked WHERE is_final
          GROUP BY key, status) AS x
    GROUP BY key
),
silent AS (
    SELECT key, array_agg(coalesce(country, '?') ORDER BY delivered DESC, country) AS countries,
           sum(delivered)::bigint AS delivered
    FROM (SELECT key, country,
                 coalesce(sum(messages) FILTER (WHERE verifiable AND delivered), 0) AS delivered,
                 coalesce(sum(verified) FILTER (WHERE verifiable), 0) AS verified
          FROM marked GROUP BY key, country) AS d
    WHERE verified = 0 AND delivered >= :min_messages
    GROUP BY key
),
latencies AS (
    SELECT key, kind, array_agg(bucket ORDER BY bucket) AS buckets,
           array_agg(messages ORDER BY bucket) AS counts,
           sum(at_submit) AS at_submit
    FROM (SELECT m.key, h.kind, h.bucket, sum(h.messages) AS messages,
                 sum(h.messages) FILTER (WHERE m.delivered AND abs(h.bucket) < :same_time_bucket)
                     AS at_submit
          FROM marked AS m
          CROSS JOIN LATERAL (
              SELECT 'done' AS kind, d.bucket, d.messages
              FROM unnest(m.to_done_buckets, m.to_done_counts) AS d(bucket, messages)
              UNION ALL
              SELECT 'received', r.bucket, r.messages
              FROM unnest(m.to_received_buckets, m.to_received_counts) AS r(bucket, messages)
          ) AS h
          WHERE m.is_final
          GROUP BY m.key, h.kind, h.bucket) AS b
    GROUP BY key, kind
),
groups AS (
    SELECT key,
           sum(messages) AS accepted,
           coalesce(sum(messages) FILTER (WHERE delivered), 0) AS delivered,
           coalesce(sum(messages) FILTER (WHERE is_final AND NOT delivered), 0) AS failed,
           coalesce(sum(messages) FILTER (WHERE NOT is_final), 0) AS awaiting,
           sum(pending) AS pending,
           sum(verified) AS verified,
           coalesce(sum(verified) FILTER (WHERE NOT delivered), 0) AS verified_without_delivered,
           coalesce(sum(messages) FILTER (WHERE verifiable), 0) AS verifiable,
           coalesce(sum(messages) FILTER (WHERE verifiable AND delivered), 0)
               AS verifiable_delivered,
           coalesce(sum(verified) FILTER (WHERE verifiable), 0) AS verifiable_verified,
           coalesce(sum(messages - verified) FILTER (WHERE verifiable AND delivered), 0)
               AS delivered_without_verification,
           coalesce(sum(with_done_time) FILTER (WHERE delivered), 0) AS delivered_with_done_time
    FROM marked
    GROUP BY key
)
SELECT g.*, coalesce(b.final_by_status, '{}') AS final_by_status,
       coalesce(s.countries, '{}') AS silent_countries,
       coalesce(s.delivered, 0) AS silent_delivered,
       coalesce(d.at_submit, 0) AS done_at_submit,
       d.buckets AS to_done_buckets, d.counts AS to_done_counts,
       r.buckets AS to_received_buckets, r.counts AS to_received_counts
FROM groups AS g
LEFT JOIN by_status AS b ON b.key IS NOT DISTINCT FROM g.key
LEFT JOIN silent AS s ON s.key IS NOT DISTINCT FROM g.key
LEFT JOIN latencies AS d ON d.key IS NOT DISTINCT FROM g.key AND d.kind = 'done'
LEFT JOIN latencies AS r ON r.key IS NOT DISTINCT FROM g.key AND r.kind = 'received'
ORDER BY g.accepted DESC, g.key NULLS LAST

-- name: verification_totals
-- `stats`: every verification recorded, and those whose message is not recorded (yet): they
-- count once it is.
SELECT count(*) AS recorded,
       count(*) FILTER (WHERE NOT EXISTS (
           SELECT 1 FROM dlr.messages AS m
           WHERE m.login = v.login AND m.message_id = v.message_id)) AS waiting_for_message
FROM dlr.verifications AS v
WHERE (:login::text IS NULL OR v.login = :login)

-- name: lock_quality_refresh
-- The lock dlr.refresh_quality_hours_up_to takes, alone in its statement: the statements after
-- it read what a refresh that held it committed; a repeatable-read transaction takes its
-- snapshot after it (LOCK takes none).
LOCK TABLE dlr.quality_refresh_lock IN EXCLUSIVE MODE

-- name: drop_unread_quality_marks
-- `maintain`: the marks of a rollup never built have no reader (its first build aggregates
-- everything). After lock_quality_refresh, so that a build that just committed keeps the
-- marks written while it ran.
DELETE FROM dlr.quality_marks
WHERE (SELECT r.position FROM dlr.quality_refresh AS r) IS NULL

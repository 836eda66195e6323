-- `dlrfeed quality` and the quality section of `dlrfeed stats` (dlrfeed.store.quality): the
-- three facts of C6 kept apart per group - accepted at submit (the sender's record, P3), the
-- status the network reported (P2), and independent verification - with the DLR latencies.

-- name: quality_groups
-- One row per group: the counts, the latencies (seconds; percentiles of the finals with a
-- usable reported done time, P19), the finals by status, and the countries of the group whose
-- verifiable DELIVERED messages (at least :min_messages) were never verified.
-- One row per message sent in [since, until): its group's keys, its computed status, the
-- reported done time and our receive time of the receipt behind it, and whether it was
-- verified. Bounded by the index on the time each message was sent (migration 0026), so a
-- week's report reads that week's messages; each message's status, event and verification
-- is a probe by key. A message recorded before migration 0020 keeps its status in
-- dlr.earlier_statuses, an event of one recorded before 0024 is in dlr.event_rows.
-- The country is looked up by the first four digits of the E.164 destination, in the map
-- dlrfeed.store.quality computes once with the phonenumbers library (:prefixes, :countries).
WITH prefix_country AS (
    SELECT p.prefix, p.country
    FROM unnest(:prefixes::text[], :countries::text[]) AS p(prefix, country)
),
sent AS MATERIALIZED (
    SELECT m.id, m.login, m.message_id, m.route, coalesce(m.source, '') AS source,
           m.submitted_at, coalesce(m.submitted_at, m.recorded_at) AS sent_at,
           CASE WHEN m.destination_is_e164 THEN substr(m.destination, 2, 4) END AS prefix
    FROM dlr.messages AS m
    WHERE coalesce(m.submitted_at, m.recorded_at) >= :since
      AND coalesce(m.submitted_at, m.recorded_at) < :until
      AND (:login::text IS NULL OR m.login = :login)
),
facts AS MATERIALIZED (
    SELECT s.login, s.route, s.source, s.submitted_at, s.sent_at, p.country,
           coalesce(st.status, es.status) AS status,
           coalesce(st.is_final, es.is_final, false) AS is_final,
           coalesce(st.basis_err, es.basis_err) AS err,
           coalesce(st.basis_done_at, es.basis_done_at) AS done_at,
           coalesce(me.first_received_at, er.first_received_at) AS received_at,
           EXISTS (SELECT 1 FROM dlr.verifications AS v
                   WHERE v.login = s.login AND v.message_id = s.message_id) AS verified
    FROM sent AS s
    LEFT JOIN prefix_country AS p ON p.prefix = s.prefix
    LEFT JOIN dlr.statuses AS st ON st.message_ref = s.id
    LEFT JOIN dlr.earlier_statuses AS es
           ON st.message_ref IS NULL AND es.login = s.login AND es.message_id = s.message_id
    LEFT JOIN dlr.message_events AS me
           ON me.id = coalesce(st.supporting_event_id, es.supporting_event_id)
    LEFT JOIN dlr.event_rows AS er
           ON me.id IS NULL AND er.id = coalesce(st.supporting_event_id, es.supporting_event_id)
),
-- Verifiable traffic: the messages of a sender address (login and source) with at least one
-- verification in the window - the kind of message that gets verified (an OTP sender's), not
-- the kind that never is (docs/quality.md).
verifying AS (
    SELECT DISTINCT login, source FROM facts WHERE verified
),
marked AS MATERIALIZED (
    SELECT CASE :key WHEN 'route' THEN f.route WHEN 'country' THEN f.country ELSE f.err END AS key,
           f.*, f.is_final AND f.status = 'DELIVERED' AS delivered,
           v.login IS NOT NULL AS verifiable
    FROM facts AS f
    LEFT JOIN verifying AS v ON v.login = f.login AND v.source = f.source
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
           count(*) FILTER (WHERE NOT is_final AND sent_at < :now::timestamptz - :deadline::interval)
               AS pending,
           count(*) FILTER (WHERE verified) AS verified,
           count(*) FILTER (WHERE verified AND NOT delivered) AS verified_without_delivered,
           count(*) FILTER (WHERE verifiable) AS verifiable,
           count(*) FILTER (WHERE verifiable AND delivered) AS verifiable_delivered,
           count(*) FILTER (WHERE verifiable AND verified) AS verifiable_verified,
           count(*) FILTER (WHERE verifiable AND delivered AND NOT verified)
               AS delivered_without_verification,
           count(*) FILTER (WHERE delivered AND done_at IS NOT NULL AND submitted_at IS NOT NULL)
               AS delivered_with_done_time,
           count(*) FILTER (WHERE delivered AND abs(extract(epoch FROM done_at - submitted_at))
                                                < :same_time_seconds) AS done_at_submit,
           percentile_cont(ARRAY[0.25, 0.5, 0.75, 0.95, 0.99]) WITHIN GROUP (
               ORDER BY extract(epoch FROM done_at - submitted_at))
               FILTER (WHERE is_final AND done_at IS NOT NULL AND submitted_at IS NOT NULL)
               AS to_done,
           percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
               ORDER BY extract(epoch FROM received_at - submitted_at))
               FILTER (WHERE is_final AND received_at IS NOT NULL AND submitted_at IS NOT NULL)
               AS to_received
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

-- name: verification_totals
-- `stats`: every verification recorded, and those whose message is not recorded (yet): they
-- count once it is.
SELECT count(*) AS recorded,
       count(*) FILTER (WHERE NOT EXISTS (
           SELECT 1 FROM dlr.messages AS m
           WHERE m.login = v.login AND m.message_id = v.message_id)) AS waiting_for_message
FROM dlr.verifications AS v
WHERE (:login::text IS NULL OR v.login = :login)

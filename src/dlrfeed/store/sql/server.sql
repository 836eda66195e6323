-- What the server behind a --database-url is (dlrfeed.store.server).

-- name: server_facts
-- Writable or not, and what a commit waits for (--require-synchronous-commit, F8).
SELECT pg_is_in_recovery() AS in_recovery,
       current_setting('transaction_read_only') = 'on' AS read_only,
       current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('synchronous_standby_names') AS standby_names

-- name: synchronous_standbys
-- Standbys connected as synchronous right now; sync_state is NULL for a role that may not see
-- replication details (pg_read_all_stats).
SELECT count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')) AS synchronous,
       count(*) FILTER (WHERE sync_state IS NULL) AS hidden
FROM pg_stat_replication

-- name: writable
-- Store.ping: false on a standby or a server in read-only mode (a failover under way).
SELECT NOT (pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on')

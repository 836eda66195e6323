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

-- name: plan_as_probes
-- The rest of this transaction (is_local) plans its statements as the index probes they are
-- written to be. Without JIT compilation: their cost estimates grow with the tables (a join
-- to partitioned dlr.receptions, whose parent has no statistics, is estimated with default
-- selectivities, far above the rows it reads); past jit_above_cost PostgreSQL compiles each
-- into machine code every time, which costs far more than the statement itself
-- (docs/postgresql.md). And with sequential scans priced out where an index can answer: a
-- table whose live rows stay few, such as dlr.event_rows where events are kept under their
-- messages (they move there as messages are recorded), looks cheaper to scan than to probe,
-- and once a burst of moves leaves dead rows in it, one scan per key costs far more than the
-- probes. Every statement of these transactions is a probe by key, so nothing is lost where a
-- table is large.
-- Transaction-scoped, so it holds behind a transaction pooler and leaves the session as it
-- was.
SELECT set_config('jit', 'off', true), set_config('enable_seqscan', 'off', true)

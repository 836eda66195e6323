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
-- The rest of this transaction (is_local: it holds behind a transaction pooler and leaves the
-- session as it was) plans its statements as the index probes they are written to be.
-- Without JIT: past jit_above_cost PostgreSQL compiles a statement into machine code every
-- time it runs, which costs far more than these probes; their estimates grow with the day
-- partitions a probe of the receptions spans, whose parent has no statistics
-- (test_the_write_transactions_plan_without_jit_and_leave_the_session_as_it_was). With
-- sequential scans priced out where an index answers: dlr.event_rows keeps few live rows (its
-- events move under their messages as messages are recorded), so it looks cheaper to scan
-- than to probe, and after a burst of moves one scan per key reads every dead row too
-- (test_the_write_transactions_probe_a_table_of_few_rows_by_its_key). Every statement of
-- these transactions is a probe by key, so nothing is lost where a table is large.
SELECT set_config('jit', 'off', true), set_config('enable_seqscan', 'off', true)

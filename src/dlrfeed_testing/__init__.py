"""Test support and local tools for dlrfeed: real servers and processes, never mocks.

Installed beside `dlrfeed` and `fakegw` (`make install`, editable), so tests and the thin
entry points in `scripts/` import it like any package; nothing edits `sys.path`. The runtime
packages never import it (tests/unit/test_layers.py). One module per job:

- servers: `pgcluster` (throwaway PostgreSQL clusters, a replicated pair), `pgbouncer`,
  `ports` (the ports a child process logs once it listens), `paths` (the clone's root);
- processes: `daemon_harness` (an in-process daemon over a real fakegw) and `fakegw_support`
  (a fakegw process and its stubs) — shared by the tests and the chaos matrix, so they live
  here rather than under tests/;
- receipts: `receipt_strategies` (hypothesis), `rule_receipts` (one receipt per rule case),
  `frozen_clock`, `retention_support`, and `oracle`, the reference rules the store is
  compared with — kept beside `invariants`, the ledger-vs-store checker that uses it;
- tools: `traffic` (the traffic generator), `webhook_receiver` (for `dlrfeed relay`),
  `callback_receiver` (for fakegw's callbacks), `demo` (`make run`),
  `config_docs`, `local_login` (the one login of the local tools), `metrics`
  (histogram quantiles);
- `bench`: one run module per benchmark family, `bench.run` for `make bench`, `bench.profile`
  for py-spy's samples and `bench.report` for docs/benchmarks.md;
- `chaos`: `chaos.rig` (the processes a scenario breaks), `chaos.scenarios` (each fault
  scenario and, as data, what it proves and shows), `chaos.run` (running them), `chaos.report`
  (docs/reliability.md) and `chaos.failover` (the failover drills).
"""

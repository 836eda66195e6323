"""dlrfeed's tools, run by `make` from the checkout and never shipped in the wheel: real servers
and processes for the tests, the benchmarks, the chaos matrix and the local demo.

The dev virtualenv finds this tree through a .pth file (`make install`), so the thin entry
points in `scripts/` and the tests import it like any package. The runtime packages never
import it (tests/unit/test_layers.py). One module per job:

- servers: `pgcluster` (throwaway PostgreSQL clusters, a replicated pair), `pgbouncer`,
  `ports` (the ports a child process logs once it listens), `paths` (the clone's root);
- processes: `daemon_harness` (an in-process daemon over a real fakegw), shared by the tests
  and the benchmarks;
- receipts: `rule_receipts` (one receipt per rule case), `retention_support`, and `oracle`, the
  reference rules the store is compared with — kept beside `invariants`, the ledger-vs-store
  checker that uses it;
- tools: `traffic` (the traffic generator), `webhook_receiver` (for `dlrfeed relay`), `demo`
  (`make run`), `config_docs`, `local_login` (the one login of the local tools), `metrics`
  (histogram quantiles), `migration_probe` (checks that a migration runs online);
- `bench`: one run module per benchmark family, `bench.run` for `make bench`, `bench.profile`
  for py-spy's samples and `bench.report` for docs/benchmarks.md;
- `chaos`: `chaos.rig` (the processes a scenario breaks), `chaos.scenarios` (each fault
  scenario and, as data, what it proves and shows), `chaos.run` (running them), `chaos.report`
  (docs/reliability.md) and `chaos.failover` (the failover drills).

What only the tests use lives under tests/support.
"""

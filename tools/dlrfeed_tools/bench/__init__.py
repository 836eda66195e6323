"""The benchmarks: a run module per family, the `make bench` run, py-spy parsing, the report."""

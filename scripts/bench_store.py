"""Benchmark of the store: Store.ingest in batches on one connection vs a naive writer.

The entry point only; the options and the logic are in `dlrfeed_tools.bench.store`.
"""

import sys

from dlrfeed_tools.bench.store import main

if __name__ == "__main__":
    sys.exit(main())

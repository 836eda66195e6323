"""A throwaway PostgreSQL cluster on a free loopback port, for tests, `make run` and benchmarks.

The entry point only; the options and the logic are in `dlrfeed_tools.pgcluster`.
"""

import sys

from dlrfeed_tools.pgcluster import main

if __name__ == "__main__":
    sys.exit(main())

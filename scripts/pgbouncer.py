"""A throwaway PgBouncer on a free loopback port in front of a throwaway PostgreSQL (pgcluster).

The entry point only; the options and the logic are in `dlrfeed_tools.pgbouncer`.
"""

import sys

from dlrfeed_tools.pgbouncer import main

if __name__ == "__main__":
    sys.exit(main())

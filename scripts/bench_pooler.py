"""What running without asyncpg's statement cache costs: Store.ingest direct vs through PgBouncer.

The entry point only; the options and the logic are in `dlrfeed_tools.bench.pooler`.
"""

import sys

from dlrfeed_tools.bench.pooler import main

if __name__ == "__main__":
    sys.exit(main())

"""Where a grown store's WAL goes, relation by relation (see the module's docstring).

The entry point only; the logic is in `dlrfeed_tools.bench.wal_sources`.
"""

import sys

from dlrfeed_tools.bench.wal_sources import main

if __name__ == "__main__":
    sys.exit(main())

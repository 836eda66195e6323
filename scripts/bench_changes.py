"""What the status-change log costs the ingest: A/B runs of Store.ingest with its triggers.

The entry point only; the options and the logic are in `dlrfeed_tools.bench.changes`.
"""

import sys

from dlrfeed_tools.bench.changes import main

if __name__ == "__main__":
    sys.exit(main())

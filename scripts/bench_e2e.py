"""End-to-end throughput of `dlrfeed run`: fakegw → dlrfeed → PostgreSQL → Ack.

The entry point only; the options and the logic are in `dlrfeed_tools.bench.e2e`.
"""

import sys

from dlrfeed_tools.bench.e2e import main

if __name__ == "__main__":
    sys.exit(main())

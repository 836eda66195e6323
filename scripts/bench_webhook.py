"""Benchmark of the callback path: `dlrfeed webhook`, group commit against one commit per callback.

The entry point only; the options and the logic are in `dlrfeed_tools.bench.webhook`.
"""

import sys

from dlrfeed_tools.bench.webhook import main

if __name__ == "__main__":
    sys.exit(main())

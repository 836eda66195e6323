"""Measure fakegw's feed throughput against a null consumer that only acks.

The entry point only; the options and the logic are in `dlrfeed_tools.bench.feed`.
"""

import sys

from dlrfeed_tools.bench.feed import main

if __name__ == "__main__":
    sys.exit(main())

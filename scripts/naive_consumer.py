"""The consumer most teams write first, as a benchmark baseline (`make bench`'s (d)).

The entry point only; the options and the logic are in `dlrfeed_tools.bench.naive_consumer`.
"""

import sys

from dlrfeed_tools.bench.naive_consumer import main

if __name__ == "__main__":
    sys.exit(main())

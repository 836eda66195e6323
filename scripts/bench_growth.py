"""Growth benchmark: one long-lived Store fed gateway-shaped traffic until the store is large.

The entry point only; the options and the logic are in `dlrfeed_tools.bench.growth`.
"""

import sys

from dlrfeed_tools.bench.growth import main

if __name__ == "__main__":
    sys.exit(main())

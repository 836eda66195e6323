"""`make bench`: ceilings, dlrfeed end to end and a naive consumer side by side.

The entry point only; the options and the logic are in `dlrfeed_tools.bench.run`.
"""

import sys

from dlrfeed_tools.bench.run import main

if __name__ == "__main__":
    sys.exit(main())

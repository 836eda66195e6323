"""`dlrfeed quality` on a grown store, from the raw tables and from its rollup.

The entry point only; the logic is in `dlrfeed_tools.bench.quality`.
"""

import sys

from dlrfeed_tools.bench.quality import main

if __name__ == "__main__":
    sys.exit(main())

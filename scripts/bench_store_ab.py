"""A/B of Store.ingest between two source trees, in one run (see the module's docstring).

The entry point only; the logic is in `dlrfeed_tools.bench.store_ab`.
"""

import sys

from dlrfeed_tools.bench.store_ab import main

if __name__ == "__main__":
    sys.exit(main())

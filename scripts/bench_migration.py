"""What a migration costs an installed store that keeps ingesting (see the module's docstring).

The entry point only; the logic is in `dlrfeed_tools.bench.migration`.
"""

import sys

from dlrfeed_tools.bench.migration import main

if __name__ == "__main__":
    sys.exit(main())

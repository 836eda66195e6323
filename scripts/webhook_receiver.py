"""A webhook endpoint for tests and the chaos matrix: checks and records what `dlrfeed relay` POSTs.

The entry point only; the options and the logic are in `dlrfeed_tools.webhook_receiver`.
"""

import sys

from dlrfeed_tools.webhook_receiver import main

if __name__ == "__main__":
    sys.exit(main())

"""The chaos matrix: seeded fault scenarios against real processes, each ending with the checker.

The entry point only; the options and the logic are in `dlrfeed_tools.chaos.run`.
"""

import sys

from dlrfeed_tools.chaos.run import main

if __name__ == "__main__":
    sys.exit(main())

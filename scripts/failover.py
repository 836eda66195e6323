"""Failover drills, measured: the failover scenario, synchronous and asynchronous, and the loss.

The entry point only; the options and the logic are in `dlrfeed_tools.chaos.failover`.
"""

import sys

from dlrfeed_tools.chaos.failover import main

if __name__ == "__main__":
    sys.exit(main())

"""Traffic simulator for the local demo: plays the sending application against a running fakegw.

The entry point only; the options and the logic are in `dlrfeed_tools.traffic`.
"""

import sys

from dlrfeed_tools.traffic import parse_args, run

if __name__ == "__main__":
    sys.exit(run(parse_args()))

"""The local demo behind `make run`: PostgreSQL, fakegw, traffic and `dlrfeed run`, one live view.

The entry point only; the options and the logic are in `dlrfeed_tools.demo`.
"""

import sys

from dlrfeed_tools.demo import parse_args, run

if __name__ == "__main__":
    sys.exit(run(parse_args()))

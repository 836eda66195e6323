"""The ledger-vs-store invariant checker: what fakegw handed out and had acked, against PostgreSQL.

The entry point only; the options and the logic are in `dlrfeed_tools.invariants`.
"""

import sys

from dlrfeed_tools.invariants import main

if __name__ == "__main__":
    sys.exit(main())

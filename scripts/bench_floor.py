"""The disk floor of the public schema beside dlrfeed's store (see the module's docstring).

The entry point only; the logic is in `dlrfeed_tools.bench.contract_floor`.
"""

import sys

from dlrfeed_tools.bench.contract_floor import main

if __name__ == "__main__":
    sys.exit(main())

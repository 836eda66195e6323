"""Store.ingest against the write floor, one idempotent INSERT per receipt (see the module).

The entry point only; the logic is in `dlrfeed_tools.bench.write_floor`.
"""

import sys

from dlrfeed_tools.bench.write_floor import main

if __name__ == "__main__":
    sys.exit(main())

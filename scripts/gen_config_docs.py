"""Writes docs/configuration.md from the command-line parsers, the one settings model.

The entry point only; the options and the logic are in `dlrfeed_tools.config_docs`.
"""

import sys

from dlrfeed_tools.config_docs import main

if __name__ == "__main__":
    sys.exit(main())

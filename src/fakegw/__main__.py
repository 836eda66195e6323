"""`python -m fakegw` runs the `fakegw` command line."""

from __future__ import annotations

import sys

from fakegw.cli import main

sys.exit(main())

"""Where the source tree is: the tools run the daemon and write run data relative to it.

The package is installed editable (`make install`), so its files stay in the clone's `src/`.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The root of the clone: `make run` keeps `.run/` here and child processes start here."""

"""The house's one direction of dependency, checked from the source (STYLE: "the house").

- `dlrfeed.domain` is pure: it imports neither grpc nor asyncpg nor any adapter;
- `dlrfeed.store` knows nothing of gRPC, `dlrfeed.feed` nothing of PostgreSQL;
- `dlrfeed.webhook` (the HTTP callbacks) knows nothing of gRPC or of the feed, its peer;
- dlrfeed and fakegw share nothing but the generated proto;
- neither runtime package imports the tools or the tests' support (`dlrfeed_tools`, `support`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def imported_modules(package: str) -> dict[str, set[str]]:
    """module file → the top-level-qualified names it imports."""
    found: dict[str, set[str]] = {}
    for path in (SRC / package.replace(".", "/")).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(SRC))] = names
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        (
            "dlrfeed/domain",
            (
                "grpc",
                "asyncpg",
                "gateway",
                "dlrfeed.store",
                "dlrfeed.feed",
                "dlrfeed.daemon",
                "dlrfeed.webhook",
                "structlog",
                "fakegw",
            ),
        ),
        (
            "dlrfeed/store",
            ("grpc", "gateway", "dlrfeed.feed", "dlrfeed.daemon", "dlrfeed.webhook", "fakegw"),
        ),
        (
            "dlrfeed/feed",
            ("asyncpg", "dlrfeed.store", "dlrfeed.daemon", "dlrfeed.webhook", "fakegw"),
        ),
        # The callback receiver is a peer of the feed over the same Store.ingest: no gRPC, and
        # no driver of its own (the store adapter is opened by its composition root).
        ("dlrfeed/webhook", ("grpc", "gateway", "asyncpg", "dlrfeed.feed", "fakegw")),
        ("dlrfeed", ("fakegw", "dlrfeed_tools", "support")),
        ("fakegw", ("dlrfeed", "dlrfeed_tools", "support")),
    ],
)
def test_no_import_crosses_a_layer(package: str, forbidden: tuple[str, ...]) -> None:
    crossings = {
        module: sorted(n for n in names if n.split(".")[0] in forbidden or n.startswith(forbidden))
        for module, names in imported_modules(package).items()
    }
    assert {m: n for m, n in crossings.items() if n} == {}


def test_the_command_line_loads_no_http_server() -> None:
    """Every command's parser is built when any `dlrfeed` command starts: the webhook
    receiver's HTTP server (aiohttp) is imported by `dlrfeed webhook` alone, not by the
    daemon, whose memory it would grow (the 1 M-backlog RSS in docs/benchmarks.md)."""
    probe = (
        "import sys; from dlrfeed.cli import build_parser; build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp'))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"

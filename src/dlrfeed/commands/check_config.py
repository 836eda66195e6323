"""Print the effective `dlrfeed run` configuration with each value's source, secrets redacted."""

from __future__ import annotations

import argparse
import json
import os

from dlrfeed.daemon.settings import DaemonSettings, add_run_arguments, effective_configuration


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The same options as `dlrfeed run`, plus --json."""
    add_run_arguments(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")


async def run(args: argparse.Namespace) -> int:
    """Validate like `dlrfeed run` would (exit 78 on a bad setting) and print the settings."""
    settings = DaemonSettings.from_args(args)
    rows = [row for row in effective_configuration(args) if row[0] != "--json"]
    rows.append(("password", "<redacted>", settings.password_source))
    if os.environ.get("DLRFEED_CONFIG") or getattr(args, "config", None):
        rows.append(("--config", str(args.config or os.environ["DLRFEED_CONFIG"]), "flag/env"))
    if args.json:
        print(json.dumps({o: {"value": v, "source": s} for o, v, s in rows}, sort_keys=True))
        return 0
    width = max(len(option) for option, _, _ in rows)
    for option, value, source in rows:
        print(f"{option:<{width}}  {value}  ({source})")
    return 0

"""Recompute stored statuses under the current rules, recording what changed and why."""

from __future__ import annotations

import argparse

from dlrfeed.config import (
    add_database_url,
    add_integration_options,
    integration_options,
    required,
)
from dlrfeed.domain.rules import RULES_VERSION
from dlrfeed.store import Store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--all to recompute every status (default: the stale ones), and the integration options
    the daemon runs with (the rules they switch on are part of the computation)."""
    add_database_url(parser)
    parser.add_argument(
        "--all",
        action="store_true",
        help=f"every status, not only those of a rules version other than {RULES_VERSION}",
    )
    add_integration_options(parser)


async def run(args: argparse.Namespace) -> int:
    """Recompute, then print how many statuses were examined and changed."""
    store = await Store.open(
        required(args, "database_url"), pool_size=1, options=integration_options(args)
    )
    try:
        result = await store.recompute(every=args.all)
    finally:
        await store.close()
    print(
        f"recomputed {result.examined} statuses under {RULES_VERSION}: {result.changed} changed "
        "(before, after and why in dlr.status_recomputations)"
    )
    return 0

"""Recompute stored statuses under the current rules, recording what changed and why."""

from __future__ import annotations

import argparse

from dlrfeed.commands.progress import ProgressReport, add_progress_every
from dlrfeed.config import (
    add_database_url,
    add_integration_options,
    integration_options,
    required,
)
from dlrfeed.domain.rules import RULES_VERSION
from dlrfeed.store import Store
from dlrfeed.store.recompute import RecomputeResult

_BUSY = 0.3  # the live ingest beside it keeps nearly its whole rate (docs/rules.md)


def _share(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError("must be above 0 and at most 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--all to recompute every status (default: the stale ones), and the integration options
    the daemon runs with (the rules they switch on are part of the computation)."""
    add_database_url(parser)
    parser.add_argument(
        "--all",
        action="store_true",
        help=f"every status, not only those of a rules version other than {RULES_VERSION} "
        "and these options",
    )
    add_integration_options(parser)
    parser.add_argument(
        "--busy",
        type=_share,
        default=_BUSY,
        metavar="SHARE",
        help="the share of the time the recompute works (0-1], pausing between chunks, so "
        "that a live daemon beside it keeps its ingest rate; 1: full speed",
    )
    add_progress_every(parser)


async def run(args: argparse.Namespace) -> int:
    """Recompute, showing progress on stderr, then print how many statuses were examined and
    changed. Each chunk commits on its own: stopped at any moment (Ctrl-C, SIGTERM), it is run
    again to finish - a plain run takes up the statuses still stale, `--all` goes over every
    one again and changes nothing the stopped run already wrote."""
    options = integration_options(args)
    store = await Store.open(required(args, "database_url"), pool_size=1, options=options)
    report = ProgressReport("recompute", unit="statuses", every_s=args.progress_every)

    def progress(done: RecomputeResult) -> None:
        report.update(
            done.examined, done.total, changed=done.changed, evidence_retired=done.evidence_retired
        )

    try:
        await store.check_schema()
        result = await store.recompute(every=args.all, progress=progress, busy=args.busy)
        report.finish()
    finally:
        await store.close()
    retired = (
        f"; {result.evidence_retired} left as they were: deliveries they were computed from "
        "were retired (docs/retention.md)"
        if result.evidence_retired
        else ""
    )
    print(
        f"recomputed {result.examined} statuses under {options.rules_version(RULES_VERSION)}: "
        f"{result.changed} changed (before, after and why in dlr.status_recomputations){retired}"
    )
    return 0

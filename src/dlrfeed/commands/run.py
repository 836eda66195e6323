"""Run the daemon: drain the login's receipt feed into PostgreSQL, acking after commit."""

from __future__ import annotations

import argparse
import sys

from dlrfeed.daemon.app import Daemon
from dlrfeed.daemon.logsetup import configure_logging
from dlrfeed.daemon.settings import DaemonSettings, add_run_arguments
from dlrfeed.daemon.supervisor import Supervisor

LOOP_FACTORY = "uvloop"
"""Read by dlrfeed.cli: this command runs on uvloop when installed (less CPU per streamed
receipt than the default loop, docs/daemon.md)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `dlrfeed run` options (dlrfeed.daemon.settings is the one definition)."""
    add_run_arguments(parser)


async def run(args: argparse.Namespace) -> int:
    """Validate settings, then run one worker or, with --processes > 1, the supervisor."""
    settings = DaemonSettings.from_args(args)
    # argparse's choices= admit only LogFormat values; the settings keep the parsed str.
    configure_logging(settings.log_level, settings.log_format)  # type: ignore[arg-type]
    if settings.processes > 1:
        return await Supervisor(settings, sys.argv[1:]).run()
    return await Daemon(settings).run()

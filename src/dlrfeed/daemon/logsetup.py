"""structlog set-up: JSON lines for journald/collectors, a human renderer on a terminal.

Events are stable snake_case names with bound fields (`batch_committed receipts=500 ms=7.1`).
Nothing here knows a secret: the password never reaches a logger (see `DaemonSettings`), and a
database URL is logged only through `redact_url`.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]


def configure_logging(level: str = "info", log_format: LogFormat = "auto") -> None:
    """Configure structlog process-wide; `auto` is console on a TTY, JSON otherwise."""
    use_console = log_format == "console" or (log_format == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        # One write() per event, newline included: worker processes share their supervisor's
        # stderr, and print()'s separate newline write lets their lines interleave.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )

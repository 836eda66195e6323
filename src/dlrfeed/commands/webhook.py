"""Take HTTP delivery-receipt callbacks (a message's dlr_url) into the store, 2xx after commit."""

from __future__ import annotations

import argparse

from dlrfeed.daemon.logsetup import configure_logging
from dlrfeed.webhook.settings import WebhookSettings, add_webhook_arguments

LOOP_FACTORY = "uvloop"
"""Read by dlrfeed.cli: this command runs on uvloop when installed."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `dlrfeed webhook` options (dlrfeed.webhook.settings is the one definition)."""
    add_webhook_arguments(parser)


async def run(args: argparse.Namespace) -> int:
    """Validate settings, then take callbacks until SIGTERM/SIGINT."""
    # Imported here: every command's parser is built at start, and the HTTP server (aiohttp)
    # would otherwise weigh on every dlrfeed process, `dlrfeed run` included (its RSS).
    from dlrfeed.webhook.app import WebhookService

    settings = WebhookSettings.from_args(args)
    # argparse's choices= admit only LogFormat values; the settings keep the parsed str.
    configure_logging(settings.log_level, settings.log_format)  # type: ignore[arg-type]
    return await WebhookService(settings).run()

"""Shared pieces of the callback receiver's tests: `dlrfeed webhook` run in-process from a real
command line, on a free loopback port, against a real store."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

from dlrfeed.cli import build_parser
from dlrfeed.config import LayeredDefaults
from dlrfeed.daemon.lifecycle import open_store
from dlrfeed.webhook.app import StoreOpener, WebhookService
from dlrfeed.webhook.settings import WebhookSettings

LOGIN = "acme"
SECRET = "webhook-s3cret-Token"  # a distinctive value, so leak tests can search for it


def webhook_settings(
    database_url: str, *extra: str, environ: Mapping[str, str] | None = None
) -> WebhookSettings:
    """Settings parsed exactly as `dlrfeed webhook` parses them (port 0: a free one)."""
    env = {} if environ is None else dict(environ)
    parser, subparsers = build_parser()
    argv = [
        "webhook",
        "--listen", "127.0.0.1:0",
        "--login", LOGIN,
        "--database-url", database_url,
        "--log-format", "json",
        *extra,
    ]  # fmt: skip
    args = LayeredDefaults(parser, subparsers, env).parse(argv)
    return WebhookSettings.from_args(args, env)


@contextlib.asynccontextmanager
async def running_webhook(
    settings: WebhookSettings, store_opener: StoreOpener = open_store
) -> AsyncIterator[WebhookService]:
    """The receiver running until the block ends; then stopped in order, its exit checked."""
    service = WebhookService(settings, store_opener=store_opener)
    task = asyncio.create_task(service.run(), name="webhook-under-test")
    ready = asyncio.create_task(service.ready.wait())
    await asyncio.wait([task, ready], timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        ready.cancel()
        if task.done():
            task.result()  # raises what stopped it
        task.cancel()
        raise AssertionError("the webhook receiver did not become ready within 30 s")
    try:
        yield service
    finally:
        service.stop()
        assert await asyncio.wait_for(task, 60) == 0


def url(service: WebhookService, path: str = "/dlr") -> str:
    """Where the running receiver takes callbacks."""
    return f"http://127.0.0.1:{service.port}{path}"

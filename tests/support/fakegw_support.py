"""Shared helpers for fakegw's tests: feed stubs with credentials, receipt bodies, a subprocess,
callback settings."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from fakegw.admin_client import basic_auth_metadata
from fakegw.callbacks import CallbackSettings
from gateway.receipts.v1 import feed_pb2, feed_pb2_grpc

LOGIN = "acme"
PASSWORD = "s3cret"
OTHER_LOGIN = "globex"
OTHER_PASSWORD = "hunter2"
LOGINS = {LOGIN: PASSWORD, OTHER_LOGIN: OTHER_PASSWORD}


def receipt_body(number: int, level: int = 2, stat: str = "DELIVRD") -> dict[str, Any]:
    """A webhook body for message `m{number}`."""
    return {"id": f"m{number}", "level": level, "stat": stat, "err": "000"}


@dataclass
class FeedClient:
    """A ReceiptFeed stub on its own channel, carrying one login's credentials."""

    channel: grpc.aio.Channel
    stub: feed_pb2_grpc.ReceiptFeedAsyncStub
    metadata: tuple[tuple[str, str], ...]

    async def pull(self, max_receipts: int = 1000, wait_seconds: int = 0) -> list[feed_pb2.Receipt]:
        """One Pull call; the receipts it returned."""
        response = await self.stub.Pull(
            feed_pb2.PullRequest(max=max_receipts, wait_seconds=wait_seconds),
            metadata=self.metadata,
            timeout=30,
        )
        return list(response.receipts)

    async def ack(self, tokens: Sequence[str]) -> feed_pb2.AckResponse:
        """One Ack call with these tokens."""
        response: feed_pb2.AckResponse = await self.stub.Ack(
            feed_pb2.AckRequest(tokens=list(tokens)), metadata=self.metadata, timeout=30
        )
        return response

    def subscribe(self, window: int = 0) -> Any:
        """A Subscribe call (async-iterable of Receipt, cancellable)."""
        return self.stub.Subscribe(feed_pb2.SubscribeRequest(window=window), metadata=self.metadata)

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close(grace=None)


def feed_client(target: str, login: str = LOGIN, password: str = PASSWORD) -> FeedClient:
    """A feed client with Basic credentials for `login`."""
    channel = grpc.aio.insecure_channel(target)
    return FeedClient(
        channel, feed_pb2_grpc.ReceiptFeedStub(channel), basic_auth_metadata(login, password)
    )


FAST_CALLBACKS = CallbackSettings(
    timeout_seconds=10.0, attempts=3, backoff_seconds=0.01, max_backoff_seconds=0.05
)
"""Callback settings for tests: retries follow each other within milliseconds, and a test that
wants a timeout sets its own short one; the receiver's answers, not the clock, decide."""


def callback_args(settings: CallbackSettings) -> list[str]:
    """`fakegw serve` flags giving a process these callback settings (bearer tokens aside:
    they come from files, `--callback-bearer-file`)."""
    return [
        *("--callback-timeout-seconds", str(settings.timeout_seconds)),
        *("--callback-attempts", str(settings.attempts)),
        *("--callback-backoff-seconds", str(settings.backoff_seconds)),
        *("--callback-max-backoff-seconds", str(settings.max_backoff_seconds)),
        *("--callback-concurrency", str(settings.concurrency)),
    ]


def start_fakegw_process(*extra_args: str) -> tuple[subprocess.Popen[str], str]:
    """Start `python -m fakegw serve` on a free port; returns the process and its target."""
    args = [sys.executable, "-m", "fakegw", "serve", "--listen", "127.0.0.1:0"]
    for login, password in LOGINS.items():
        args += ["--login", f"{login}:{password}"]
    process = subprocess.Popen(
        [*args, *extra_args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.kill()
        process.wait()
        raise RuntimeError("fakegw exited before listening")
    announced = json.loads(line)
    return process, str(announced["target"])


async def wait_until(predicate: Callable[[], bool], within_seconds: float = 30.0) -> None:
    """Poll `predicate` until true; fail the test after `within_seconds` (generous: a loaded
    machine is slow, and a condition met returns at once)."""
    give_up = time.monotonic() + within_seconds
    while not predicate():
        assert time.monotonic() < give_up, "condition not reached in time"
        await asyncio.sleep(0.01)


class StreamReader:
    """Reads a Subscribe stream into a list in the background."""

    def __init__(self, client: FeedClient, window: int = 0) -> None:
        self.call = client.subscribe(window)
        self.receipts: list[feed_pb2.Receipt] = []
        self.error: grpc.aio.AioRpcError | None = None
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for receipt in self.call:
                self.receipts.append(receipt)
        except grpc.aio.AioRpcError as exc:
            self.error = exc
        except asyncio.CancelledError:
            return

    async def stop(self) -> None:
        """Cancel the stream and wait for the reader to finish."""
        self.call.cancel()
        await self.task


def stop_fakegw_process(process: subprocess.Popen[str], signum: int) -> int:
    """Send `signum` (SIGKILL for a crash, SIGTERM for a clean stop); wait; close the pipe."""
    process.send_signal(signum)
    try:
        return process.wait(timeout=10)
    finally:
        if process.stdout is not None:
            process.stdout.close()

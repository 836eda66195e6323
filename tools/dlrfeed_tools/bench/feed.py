"""Measure fakegw's feed throughput against a null consumer that only acks.

The server (fakegw with `--store :memory:`, or a bare grpc.aio streamer for the ceiling) runs in
its own process; this process is the consumer, so the figures are honest on 2 cores. Each mode
preloads a backlog through the admin API, then times how fast the consumer drains it, acking
every 500 receipts in the background. Modes:

- `bare_stream`: a bare grpc.aio server-stream of the same ~300-byte receipts, no acks: the
  ceiling for one stream in Python gRPC on this machine;
- `subscribe_1`, `subscribe_2`: one and two Subscribe streams (window 1000);
- `pull`: Pull with max 1000 in a loop.

`python scripts/bench_feed.py --json` prints one JSON object; `measure_feed()` returns it.
Targets (reported, never asserted): >= 10,000/s one stream, >= 15,000/s two, >= 100,000/s Pull.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import grpc

from dlrfeed_tools.local_login import LOGIN, PASSWORD
from fakegw.admin_client import SyncAdminClient, basic_auth_metadata
from gateway.receipts.v1 import feed_pb2, feed_pb2_grpc

ACK_BATCH = 500
TARGETS = {"subscribe_1": 10_000, "subscribe_2": 15_000, "pull": 100_000}


def sample_receipt(number: int) -> dict[str, Any]:
    """A realistic receipt body, about 300 bytes on the wire with its token."""
    return {
        "id": f"{number:032x}",
        "level": 2,
        "stat": "DELIVRD",
        "err": "000",
        "sub": "001",
        "dlvrd": "001",
        "submit_date": "2611291200",
        "done_date": "2611291201",
        "text": "Your verification code is 123456. Do not share it with anyone. Thanks",
        "source_addr": "ACMEBANK",
        "destination_addr": "34600123456",
        "smsc_message_id": f"{number:020d}",
        "connector": "smsc-eu-west-1",
    }


@contextmanager
def _server_process(args: list[str]) -> Iterator[str]:
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"server exited: {args}")
        yield str(json.loads(line)["target"])
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


@contextmanager
def _fakegw() -> Iterator[str]:
    with _server_process(
        [
            sys.executable,
            "-m",
            "fakegw",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--login",
            f"{LOGIN}:{PASSWORD}",
            "--store",
            ":memory:",
            "--cap",
            "100000000",
        ]
    ) as target:
        yield target


def _preload(target: str, count: int) -> float:
    """Inject `count` receipts; returns the inject rate (receipts/s) for the record."""
    started = time.perf_counter()
    with SyncAdminClient(target, LOGIN, PASSWORD, timeout=300) as admin:
        for start in range(0, count, 10_000):
            admin.inject(sample_receipt(i) for i in range(start, min(count, start + 10_000)))
    return count / (time.perf_counter() - started)


class _Acker:
    """Acks tokens in batches of 500 in the background, like a consumer that stored them."""

    def __init__(self, stub: feed_pb2_grpc.ReceiptFeedAsyncStub) -> None:
        self._stub = stub
        self._metadata = basic_auth_metadata(LOGIN, PASSWORD)
        self._pending: list[str] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, tokens: list[str]) -> None:
        self._pending.extend(tokens)
        while len(self._pending) >= ACK_BATCH:
            batch, self._pending = self._pending[:ACK_BATCH], self._pending[ACK_BATCH:]
            self._launch(batch)

    def _launch(self, batch: list[str]) -> None:
        task = asyncio.create_task(self._ack(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ack(self, batch: list[str]) -> None:
        await self._stub.Ack(feed_pb2.AckRequest(tokens=batch), metadata=self._metadata)

    async def drain(self) -> None:
        if self._pending:
            self._launch(self._pending)
            self._pending = []
        while self._tasks:
            await asyncio.gather(*self._tasks)


@asynccontextmanager
async def _stub(target: str) -> AsyncIterator[feed_pb2_grpc.ReceiptFeedAsyncStub]:
    channel = grpc.aio.insecure_channel(target)
    try:
        yield feed_pb2_grpc.ReceiptFeedStub(channel)
    finally:
        await channel.close(grace=None)


async def _stream_reader(target: str, quota: int, window: int) -> None:
    async with _stub(target) as stub:
        acker = _Acker(stub)
        call = stub.Subscribe(
            feed_pb2.SubscribeRequest(window=window),
            metadata=basic_auth_metadata(LOGIN, PASSWORD),
        )
        received = 0
        tokens: list[str] = []
        async for receipt in call:
            tokens.append(receipt.ack_token)
            received += 1
            if len(tokens) >= ACK_BATCH:
                acker.add(tokens)
                tokens = []
            if received >= quota:
                break
        acker.add(tokens)
        await acker.drain()
        call.cancel()


async def _measure_subscribe(streams: int, count: int) -> float:
    with _fakegw() as target:
        _preload(target, count)
        quota = count // streams
        started = time.perf_counter()
        await asyncio.gather(*(_stream_reader(target, quota, 1000) for _ in range(streams)))
        return quota * streams / (time.perf_counter() - started)


async def _measure_pull(count: int) -> tuple[float, float]:
    with _fakegw() as target:
        inject_rate = _preload(target, count)
        async with _stub(target) as stub:
            acker = _Acker(stub)
            metadata = basic_auth_metadata(LOGIN, PASSWORD)
            received = 0
            started = time.perf_counter()
            while received < count:
                response = await stub.Pull(
                    feed_pb2.PullRequest(max=1000, wait_seconds=1), metadata=metadata
                )
                acker.add([r.ack_token for r in response.receipts])
                received += len(response.receipts)
            await acker.drain()
            return count / (time.perf_counter() - started), inject_rate


async def _measure_bare_stream(count: int) -> float:
    with _server_process(
        [sys.executable, "-m", "dlrfeed_tools.bench.feed", "--bare-server"]
    ) as target:
        async with _stub(target) as stub:
            started = time.perf_counter()
            received = 0
            async for _receipt in stub.Subscribe(feed_pb2.SubscribeRequest(window=count)):
                received += 1
            assert received == count
            return count / (time.perf_counter() - started)


async def _bare_server() -> None:
    """A bare grpc.aio server streaming one pre-serialized receipt `window` times."""
    payload = feed_pb2.Receipt(
        **sample_receipt(1), ack_token="A" * 34, delivery_count=1
    ).SerializeToString()

    async def subscribe(request: feed_pb2.SubscribeRequest, context: Any) -> AsyncIterator[bytes]:
        for _ in range(request.window):
            yield payload

    handler = grpc.method_handlers_generic_handler(
        "gateway.receipts.v1.ReceiptFeed",
        {
            "Subscribe": grpc.unary_stream_rpc_method_handler(
                subscribe,
                request_deserializer=feed_pb2.SubscribeRequest.FromString,
                response_serializer=_identity,
            )
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(json.dumps({"target": f"127.0.0.1:{port}"}), flush=True)
    await server.wait_for_termination()


def _identity(payload: bytes) -> bytes:
    return payload


async def measure_feed(
    stream_receipts: int = 40_000, pull_receipts: int = 300_000
) -> dict[str, Any]:
    """Run every mode once and return receipts/s per mode, the targets and the setup."""
    results: dict[str, Any] = {}
    results["subscribe_1"] = round(await _measure_subscribe(1, stream_receipts))
    results["subscribe_2"] = round(await _measure_subscribe(2, stream_receipts))
    results["bare_stream"] = round(await _measure_bare_stream(stream_receipts))
    pull_rate, inject_rate = await _measure_pull(pull_receipts)
    results["pull"] = round(pull_rate)
    results["inject"] = round(inject_rate)
    results["targets"] = TARGETS
    results["met"] = {mode: results[mode] >= target for mode, target in TARGETS.items()}
    results["setup"] = {
        "stream_receipts": stream_receipts,
        "pull_receipts": pull_receipts,
        "ack_batch": ACK_BATCH,
        "cpus": os.cpu_count(),
        "server": "fakegw --store :memory: in its own process",
        "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
    }
    return results


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed, as `fakegw serve` uses by default: a fair ceiling."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> int:
    """Command line: `--json` prints the summary as JSON, else a short table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--stream-receipts", type=int, default=40_000)
    parser.add_argument("--pull-receipts", type=int, default=300_000)
    parser.add_argument("--bare-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        if args.bare_server:
            runner.run(_bare_server())
            return 0
        results = runner.run(measure_feed(args.stream_receipts, args.pull_receipts))
    if args.json:
        print(json.dumps(results))
    else:
        for mode in ("bare_stream", "subscribe_1", "subscribe_2", "pull", "inject"):
            target = f" (target {TARGETS[mode]:,})" if mode in TARGETS else ""
            print(f"{mode:12} {results[mode]:>10,} receipts/s{target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

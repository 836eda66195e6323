"""A minimal HTTP/1.1 endpoint on loopback that records the callbacks fakegw POSTs (F2).

It runs on the test's event loop (plain asyncio streams, no HTTP library, so it shares no code
with the client it tests) and answers each path from a script, then 200:

    async with CallbackReceiver({"/dlr": [Reply(503), Reply(503)]}) as receiver:
        url = receiver.url("/dlr")  # POSTs to it answer 503, 503, then 200
        ...
        assert receiver.bodies("/dlr") == [...]

Every request is recorded when it arrives, before the answer, so a request answered late (a
`Reply(delay_seconds=...)` beyond the sender's timeout) is still seen. `in_flight_peak` is the
most requests that were open at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted answer: a status, extra headers, and how long to wait before answering
    (`held`: until `release_held()`)."""

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    delay_seconds: float = 0.0
    held: bool = False


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as it arrived: method, path (with query), headers (lower-case), body."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


@dataclass
class CallbackReceiver:
    """An HTTP endpoint on 127.0.0.1 answering each path from its script, then 200."""

    script: dict[str, list[Reply]] = field(default_factory=dict)
    received: list[ReceivedRequest] = field(default_factory=list)
    in_flight_peak: int = 0
    port: int = 0
    _in_flight: int = 0
    _server: asyncio.Server | None = None
    _closing: asyncio.Event = field(default_factory=asyncio.Event)
    _released: asyncio.Event = field(default_factory=asyncio.Event)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def __aenter__(self) -> CallbackReceiver:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self, port: int = 0) -> None:
        """Listen on 127.0.0.1:`port` (0 = a free one; `port` says which)."""
        self._closing.clear()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening, cut open connections and end delayed answers at once."""
        self._closing.set()
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()
            self._server = None

    def release_held(self) -> None:
        """Answer the requests waiting on a `held` reply, and the later ones at once."""
        self._released.set()

    @property
    def in_flight(self) -> int:
        """Requests received and not answered yet."""
        return self._in_flight

    def url(self, path: str = "/dlr", userinfo: str = "") -> str:
        """The URL of `path` here, with `user:password@` when `userinfo` is given."""
        credentials = f"{userinfo}@" if userinfo else ""
        return f"http://{credentials}127.0.0.1:{self.port}{path}"

    def requests(self, path: str | None = None) -> list[ReceivedRequest]:
        """The requests received (on `path`, or on any), in arrival order."""
        return [r for r in self.received if path is None or r.path == path]

    def bodies(self, path: str | None = None) -> list[Any]:
        """The JSON bodies received (on `path`, or on any), in arrival order."""
        return [r.json() for r in self.requests(path)]

    def _next_reply(self, path: str) -> Reply:
        replies = self.script.get(path)
        return replies.pop(0) if replies else Reply()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client hung up (its timeout): nothing to answer
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Read, record and answer one request; False when the connection is done."""
        request_line = await reader.readline()
        if not request_line:
            return False
        method, path, _ = request_line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.received.append(ReceivedRequest(method, path, headers, body))
        self._in_flight += 1
        self.in_flight_peak = max(self.in_flight_peak, self._in_flight)
        try:
            reply = self._next_reply(path)
            if reply.delay_seconds:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), reply.delay_seconds)
            if reply.held:
                await _first(self._released.wait(), self._closing.wait())
            if self._closing.is_set():
                return False
            await self._answer(writer, reply)
        finally:
            self._in_flight -= 1
        return headers.get("connection", "").lower() != "close"

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, reply: Reply) -> None:
        phrase = http.HTTPStatus(reply.status).phrase
        lines = [f"HTTP/1.1 {reply.status} {phrase}", "Content-Length: 0"]
        lines += [f"{name}: {value}" for name, value in reply.headers]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()


async def _first(*waits: Coroutine[Any, Any, Any]) -> None:
    """Wait until the first of these finishes; cancel the others."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def replies(*statuses: int) -> list[Reply]:
    """A script of plain answers with these statuses."""
    return [Reply(status) for status in statuses]

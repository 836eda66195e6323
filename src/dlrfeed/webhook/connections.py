"""The receiver's connections, bounded: a cap on how many are open, and the HTTP layer's own
errors logged as one JSON event each.

Each connection holds a descriptor and a little memory, so the number open at once is capped
(`--max-connections`, under the open-files limit): one past the cap is answered a plain 503
with `Retry-After` and closed, instead of queueing in the backlog until every caller is locked
out. The header and idle deadline is aiohttp's keep-alive timer (armed when a connection opens
and after each answer; see app.py), the body deadline the handler's (server.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, cast

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from dlrfeed.errors import StoreUnavailableError

log = structlog.get_logger("dlrfeed.webhook")

_OVER_CAP = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Retry-After: 1\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 38\r\n"
    b"Connection: close\r\n\r\n"
    b"too many connections open; retry later\n"
)


KeepBroken = Callable[[bytes, str, asyncio.BaseTransport | None], Awaitable[None]]
"""Keeps the body bytes of a request aiohttp could not parse: (bytes, reason, transport)."""
WantsBody = Callable[[bytes], bool]
"""Given a request's head (its line and headers), whether its body is worth keeping should
its framing break: only a caller that authenticates, sending a chunked body."""
_HEAD_LIMIT = 16384  # bytes of a request's line and headers held until the head is complete


class CappedSite(web.TCPSite):
    """A TCP site that opens at most `max_connections` connections at once, each a
    `RecordingHandler`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        max_connections: int,
        keep_broken: KeepBroken,
        wants_body: WantsBody,
        max_body_bytes: int,
    ):
        super().__init__(runner, host, port)
        self._max_connections = max_connections
        self._keep_broken = keep_broken
        self._wants_body = wants_body
        self._max_body_bytes = max_body_bytes

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner, as TCPSite does
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._connection, self._host, self._port, backlog=self._backlog, reuse_address=True
        )

    def _connection(self) -> asyncio.BaseProtocol:
        server = self._runner.server
        assert server is not None  # set by runner.setup(), before any site starts
        if len(server.connections) >= self._max_connections:
            return _OverCap()
        # As web.Server() builds its handler (the runner's options are its _kwargs).
        return RecordingHandler(
            server,
            loop=asyncio.get_running_loop(),
            keep_broken=self._keep_broken,
            wants_body=self._wants_body,
            limit=self._max_body_bytes,
            **server._kwargs,  # the options the runner was given
        )


class RecordingHandler(RequestHandler):
    """aiohttp's connection handler, keeping the bytes of the request being received (at
    most `limit` of its body) so that a body aiohttp's parser refuses (a broken chunked
    framing) is kept as evidence before its 400, never lost. Only the body of a caller that
    authenticates is held (`wants_body`); of anyone else, at most the head until it is
    complete, so an unauthenticated connection pins no more than that. The request line and
    headers are never kept: a secret may stand in them."""

    def __init__(
        self,
        server: web.Server,
        *,
        keep_broken: KeepBroken,
        wants_body: WantsBody,
        limit: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(server, **kwargs)
        self._keep_broken = keep_broken
        self._wants_body = wants_body
        self._limit = limit
        self._arrived = bytearray()
        self._recording = True

    def data_received(self, data: bytes) -> None:
        if self._recording:
            self._record(data)
        super().data_received(data)

    def _record(self, data: bytes) -> None:
        head_done = b"\r\n\r\n" in self._arrived
        self._arrived += data[: self._limit * 2 + _HEAD_LIMIT - len(self._arrived)]
        if head_done:
            return
        head, separator, _ = bytes(self._arrived).partition(b"\r\n\r\n")
        if separator and not self._wants_body(head):
            self._stop_recording()
        elif not separator and len(self._arrived) >= _HEAD_LIMIT:
            self._stop_recording()  # a head past any the parser takes: it refuses it itself

    def _stop_recording(self) -> None:
        self._arrived = bytearray()
        self._recording = False

    def request_answered(self) -> None:
        """The request being received is answered: what comes next is another one."""
        self._arrived = bytearray()
        self._recording = True

    def _make_error_handler(self, err_info: Any) -> Callable[[Any], Awaitable[web.StreamResponse]]:
        plain = super()._make_error_handler(err_info)
        _, separator, body = bytes(self._arrived).partition(b"\r\n\r\n")
        self._arrived = bytearray()
        error = getattr(err_info, "exc", None)
        if not separator or not body or not isinstance(error, HttpProcessingError):
            return plain  # nothing of a body arrived: there is nothing to keep
        # The parser's own message quotes the line it refused, which may hold a secret.
        reason = (
            f"the request's framing is broken ({type(error).__name__}); "
            "its body as it arrived is kept"
        )
        transport = self.transport

        async def keep_then_answer(request: Any) -> web.StreamResponse:
            try:
                await self._keep_broken(body[: self._limit], reason, transport)
            except StoreUnavailableError as exc:
                # The caller gets aiohttp's 400 all the same (its request cannot be read);
                # what it sent is only in this log line.
                log.warning("broken_request_not_kept", reason=reason, error=str(exc))
            return await plain(request)

        return keep_then_answer


class _OverCap(asyncio.Protocol):
    """A connection past the cap: told to retry, then closed; nothing of it is read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass, so no isinstance).
        cast("asyncio.WriteTransport", transport).write(_OVER_CAP)
        transport.close()


class _OneEvent(logging.Handler):
    """aiohttp's own error records (a request it could not parse, a client gone mid-answer)
    as one structlog event each, without the traceback, and with any secret blanked."""

    def __init__(self, secrets: tuple[bytes, ...]) -> None:
        super().__init__(logging.DEBUG)
        self._secrets = [s.decode("utf-8", "replace") for s in secrets]

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        detail = " ".join(str(error if error is not None else record.getMessage()).split())
        for secret in self._secrets:
            detail = detail.replace(secret, "<secret>")
        log.warning(
            "http_request_refused",
            error=type(error).__name__ if error is not None else None,
            detail=detail[:300],
        )


@contextlib.contextmanager
def quiet_http_errors(secrets: tuple[bytes, ...]) -> Iterator[None]:
    """While the block runs, aiohttp's server errors are logged as `_OneEvent` says."""
    logger = logging.getLogger("aiohttp.server")
    handler = _OneEvent(secrets)
    before = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = before

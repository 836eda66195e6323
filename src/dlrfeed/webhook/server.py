"""The HTTP side of `dlrfeed webhook`: a callback in, its reception committed, then the answer.

What each answer means to the gateway that posted (docs/webhook.md, "Answers"):
- 200: the reception is committed, whatever its outcome (applied, repeat, conflict,
  uncorrelated, ...): forget it.
- 400: the callback cannot be read as a receipt; its bytes are committed as evidence (C8). Do
  not retry: the same bytes again are the same open investigation.
- 413: the body is over --max-body-bytes; its first bytes are committed as evidence.
- 408: the body did not arrive within --body-timeout; the part that arrived is kept as
  evidence, nothing is applied: post it again.
- 415: a Content-Encoding the receiver does not decode (br, zstd, ...); its bytes are committed
  as evidence, as for a 400.
- 401: no valid secret; nothing stored (anybody could fill the queue otherwise).
- 404 / 405: another path or method; nothing stored.
- 503 + Retry-After: PostgreSQL cannot commit now, or too much is waiting; nothing stored:
  retry later.

Never a 2xx before the commit (P6: persist the reception before any effect), and never a 5xx
for a callback that is merely bad: a 5xx asks for a retry, which could not help it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import time
import zlib
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Protocol
from urllib.parse import unquote_to_bytes

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from dlrfeed.domain.receipt import AckToken, MessageId, Receipt, UnreadableCallback
from dlrfeed.domain.status import Outcome
from dlrfeed.errors import StoreUnavailableError
from dlrfeed.webhook.connections import RecordingHandler
from dlrfeed.webhook.formats import (
    Callback,
    CallbackFormat,
    MalformedCallback,
    ReceiptFields,
    evidence,
    read_flagged,
    readable_id,
)

if TYPE_CHECKING:
    from prometheus_client import Counter

    from dlrfeed.webhook.metrics import WebhookMetrics

log = structlog.get_logger("dlrfeed.webhook")

PATHS = ("/", "/dlr")
PATH_WITH_SECRET = "/dlr/{secret}"  # noqa: S105  # a route pattern, for callers without headers
_MAX_FORWARDED = 200  # characters of X-Forwarded-For kept with the peer
# What a peer gateway takes as "received": Jasmin retries a callback whose answer body is not
# exactly `ACK/Jasmin` (its HTTP API, "Receiving DLR"); Kannel and the gateway read the status.
_SUCCESS_BODY = {
    CallbackFormat.GATEWAY: None,  # JSON with the outcome
    CallbackFormat.JASMIN: "ACK/Jasmin",
    CallbackFormat.KANNEL: "OK",
}
# How each peer calls back: Jasmin by its dlr-method (GET or POST), Kannel by GET only (smsbox
# fetches a dlr-url).
_METHODS = {
    CallbackFormat.GATEWAY: frozenset({"POST"}),
    CallbackFormat.JASMIN: frozenset({"GET", "POST"}),
    CallbackFormat.KANNEL: frozenset({"GET"}),
}


class Intake(Protocol):
    """What the server needs of CallbackIntake."""

    @property
    def in_hand(self) -> int: ...

    async def take(self, receipt: Receipt) -> Outcome: ...

    async def keep(self, callback: UnreadableCallback) -> None: ...


class _Refused(Exception):  # noqa: N818  # a control-flow signal inside the handler
    """A request answered without reading (or keeping) its body."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


class _Unreadable(Exception):  # noqa: N818  # a control-flow signal inside the handler
    """What arrived is kept as evidence and answered `status`."""

    def __init__(self, raw: bytes, reason: str, status: int) -> None:
        super().__init__(reason)
        self.raw, self.reason, self.status = raw, reason, status


# The gateway format's 200 body per outcome, encoded once: every answer sends one of these.
_OUTCOME_BODY = {outcome: json.dumps({"outcome": outcome.value}).encode() for outcome in Outcome}
_MAX_FLOOD_HOSTS = 10_000  # callers whose unreadable callbacks are counted at once
_DECODERS = {  # Content-Encoding → zlib wbits (RFC 9110 §8.4.1)
    "gzip": 16 + zlib.MAX_WBITS,
    "x-gzip": 16 + zlib.MAX_WBITS,
    "deflate": zlib.MAX_WBITS,
}


class FloodGuard:
    """How many investigations each caller's unreadable callbacks may open: a token bucket
    per peer host, `per_minute` tokens a minute, as many at most. A callback beyond it is
    still kept whole, as evidence of one open investigation for that caller (coalesced), so
    a flood of distinct garbage from one peer opens one item, not thousands."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = per_minute / 60.0
        self._burst = float(per_minute)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # host → (tokens, at)

    def flood_key(self, host: str) -> str | None:
        """None when `host` may open an investigation now (a token is spent), else the key of
        its coalesced one."""
        now = self._clock()
        tokens, at = self._buckets.get(host, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) * self._rate)
        if len(self._buckets) > _MAX_FLOOD_HOSTS:
            self._buckets.clear()  # memory stays bounded; every host starts a fresh minute
        if tokens >= 1.0:
            self._buckets[host] = (tokens - 1.0, now)
            return None
        self._buckets[host] = (tokens, now)
        return f"flood:{host}"


class CallbackServer:
    """The aiohttp application of the receiver; `app` is served by the composition root."""

    def __init__(
        self,
        *,
        login: str,
        callback_format: CallbackFormat,
        intake: Intake,
        metrics: WebhookMetrics,
        secrets: tuple[bytes, ...],
        max_body_bytes: int,
        retry_after: int,
        max_in_hand: int,
        body_timeout: float = 10.0,
        max_bodies_bytes: int = 64 * 1024 * 1024,
        unreadable_per_minute: int = 60,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._login = login
        self._format = callback_format
        self._intake = intake
        self._metrics = metrics
        self._secrets = secrets
        self._max_body_bytes = max_body_bytes
        self._retry_after = str(retry_after)
        self._max_in_hand = max_in_hand
        self._body_timeout = body_timeout
        self._max_bodies_bytes = max_bodies_bytes
        self._bodies_bytes = 0  # reserved by the bodies being read now
        self._flood = FloodGuard(unreadable_per_minute)
        self._clock = clock
        # status → its child of the requests counter: labels() takes a lock and checks its
        # label names at every call, once per answer
        self._answered: dict[int, Counter] = {}
        self.app = web.Application()
        for path in (*PATHS, PATH_WITH_SECRET):
            self.app.router.add_route("*", path, self._handle)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        response = await self._answer(request)
        answered = self._answered.get(response.status)
        if answered is None:
            answered = self._answered[response.status] = self._metrics.requests.labels(
                code=str(response.status)
            )
        answered.inc()
        if isinstance(request.protocol, RecordingHandler):
            request.protocol.request_answered()
        return response

    async def _answer(self, request: web.Request) -> web.Response:
        if request.method not in _METHODS[self._format]:
            allowed = ", ".join(sorted(_METHODS[self._format]))
            return _text(405, f"{request.method} is not a callback here\n", Allow=allowed)
        if not self._authorized(request):
            log.warning("callback_unauthorized", peer=_peer(request))
            return _text(
                401,
                "a valid secret is required (Bearer token, Basic password, or /dlr/SECRET)\n",
                **{"WWW-Authenticate": 'Basic realm="dlrfeed", charset="UTF-8"'},
            )
        if self._intake.in_hand >= self._max_in_hand:
            # Shed load before reading the body: the commits are behind; the gateway retries.
            return self._unavailable("too many callbacks waiting for a commit")
        started = time.monotonic()
        try:
            outcome = await self._receive(request, _peer(request))
        except StoreUnavailableError:
            # The reason is in the log (store_unavailable); the caller learns only to retry.
            return self._unavailable("the store cannot take callbacks now")
        finally:
            self._metrics.answer_seconds.observe(time.monotonic() - started)
        if isinstance(outcome, web.Response):
            return outcome
        success = _SUCCESS_BODY[self._format]
        if success is None:
            return web.Response(body=_OUTCOME_BODY[outcome], content_type="application/json")
        return _text(200, success)

    async def _receive(self, request: web.Request, peer: str | None) -> Outcome | web.Response:
        """The callback read and committed: its outcome, or the answer it gets instead."""
        try:
            body = await self._read_body(request)
        except _Refused as refused:
            return refused.response
        except _Unreadable as bad:
            return await self._keep_unreadable(request, bad.raw, bad.reason, peer, bad.status)
        callback = Callback(
            method=request.method,
            query=request.raw_path.partition("?")[2],
            content_type=request.headers.get("Content-Type"),
            body=body,
        )
        raw = evidence(callback)
        try:
            reading = read_flagged(self._format, callback)
        except MalformedCallback as exc:
            return await self._keep_unreadable(request, raw, str(exc), peer, 400, exc.message_id)
        return await self._intake.take(self._receipt(reading.fields, raw, peer, reading.flags))

    def _authorized(self, request: web.Request) -> bool:
        """Bearer SECRET, Basic with SECRET as the password (any user name), or SECRET as the
        path's last segment (/dlr/SECRET), against every secret valid now, each compared in
        constant time; every request passes when no secret is set. A path that names a
        secret is judged by it alone."""
        in_path = request.match_info.get("secret")
        return self._presents_a_secret(
            None if in_path is None else in_path.encode("utf-8", "surrogateescape"),
            request.headers.get("Authorization"),
        )

    def wants_broken_body(self, head: bytes) -> bool:
        """Whether the body of the request whose line and headers are `head` is kept should
        its chunked framing break: a chunked body from a caller that authenticates (evidence
        is written for callers that may write it, never for anyone who connects)."""
        if b"chunked" not in head.lower():
            return False  # most requests: no chunked framing to break, no headers to read
        request_line, *header_lines = head.split(b"\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().decode("latin-1")
        if "chunked" not in headers.get(b"transfer-encoding", "").lower():
            return False
        target = request_line.split(b" ")[1] if request_line.count(b" ") >= 2 else b""
        path = unquote_to_bytes(target.partition(b"?")[0])
        prefix = PATH_WITH_SECRET.partition("{")[0].encode()
        in_path = path[len(prefix) :] if path.startswith(prefix) else None
        if in_path is not None and (not in_path or b"/" in in_path):
            return False  # not the route of a secret: aiohttp answers it 404
        return self._presents_a_secret(in_path, headers.get(b"authorization"))

    def _presents_a_secret(self, in_path: bytes | None, header: str | None) -> bool:
        if not self._secrets:
            return in_path is None
        if in_path is not None:
            return self._matches(in_path)
        if header is None:
            return False
        scheme, _, credentials = header.strip().partition(" ")
        presented: bytes
        if scheme.lower() == "bearer":
            presented = credentials.strip().encode("utf-8", "surrogateescape")
        elif scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(credentials.strip(), validate=True)
            except (binascii.Error, ValueError):
                return False
            presented = decoded.partition(b":")[2]
        else:
            return False
        return self._matches(presented)

    def _matches(self, presented: bytes) -> bool:
        # Every secret compared, none skipped: the time says nothing of which one matched.
        found = False
        for secret in self._secrets:
            found |= hmac.compare_digest(presented, secret)
        return found

    async def _read_body(self, request: web.Request) -> bytes:
        """The body as the gateway meant it: read within --body-timeout, at most
        --max-body-bytes of it, decoded from its Content-Encoding. _Refused when it cannot be
        read now (nothing kept), _Unreadable with what arrived when it is not a body."""
        if not request.body_exists:
            return b""  # a GET: the callback is in its query
        limit = self._max_body_bytes
        declared = request.content_length
        # Reserve the bytes this body may take from the bound of all bodies in flight.
        reserved = min(limit + 1, declared if declared is not None else limit + 1)
        if self._bodies_bytes + reserved > self._max_bodies_bytes:
            raise _Refused(self._unavailable("too many bodies being received at once"))
        self._bodies_bytes += reserved
        try:
            chunks: list[bytes] = []
            size = 0
            try:
                # Most bodies arrive with their head: taken at once, with no deadline to set.
                arrived = request.content.read_nowait()
                if arrived:  # none yet (a slow caller, `Expect: 100-continue`): none to keep
                    chunks.append(arrived)
                size = len(arrived)
                if not request.content.at_eof() and size <= limit:
                    async with asyncio.timeout(self._body_timeout):
                        async for chunk in request.content.iter_any():
                            chunks.append(chunk)
                            size += len(chunk)
                            if size > limit:
                                break
            except TimeoutError:
                log.info("callback_body_timeout", peer=_peer(request), bytes_received=size)
                _keep_partial(chunks, limit, "did not arrive within --body-timeout", 408)
                raise _Refused(
                    _text(408, "the body did not arrive in time; nothing stored: send it again\n")
                ) from None
            except (HttpProcessingError, ConnectionError, web.HTTPException) as exc:
                # Broken framing (a bad chunk size: aiohttp answers 400 and drops the
                # connection) or a caller gone mid-body: what arrived is kept.
                _keep_partial(chunks, limit, f"broke off ({type(exc).__name__})", 400)
                raise _Refused(_text(400, "the body broke off; nothing stored\n")) from None
            body = b"".join(chunks)
        finally:
            self._bodies_bytes -= reserved
        if len(body) > limit:
            raise _Unreadable(
                body[:limit],
                f"the body is over --max-body-bytes ({limit} bytes); its first {limit} bytes "
                "are kept",
                413,
            )
        return _decoded(body, request.headers.get("Content-Encoding"), limit)

    async def _keep_unreadable(
        self,
        request: web.Request,
        raw: bytes,
        reason: str,
        peer: str | None,
        status: int,
        message_id: str | None = None,
    ) -> web.Response:
        """C8: the bytes committed as evidence first (with the next group commit), then the
        answer that stops retries."""
        await self._keep(raw, reason, request.transport, peer, message_id)
        if status == HTTPStatus.REQUEST_TIMEOUT:
            return _text(status, f"{reason}; not a receipt until it all arrives: send it again\n")
        return _text(status, f"{reason}; kept as evidence, do not retry\n")

    async def keep_broken_request(
        self, raw: bytes, reason: str, transport: asyncio.BaseTransport | None
    ) -> None:
        """Keep the body of a request aiohttp's parser refused (connections.RecordingHandler)."""
        await self._keep(raw, reason, transport, _peer_of(transport, None), None)

    async def _keep(
        self,
        raw: bytes,
        reason: str,
        transport: asyncio.BaseTransport | None,
        peer: str | None,
        message_id: str | None,
    ) -> None:
        """An unreadable callback kept with the next group commit: under the id it names
        when one can be read (P24), coalesced when its caller floods (FloodGuard)."""
        if message_id is None:  # `raw` is the evidence: read as a body, whatever the method
            message_id = readable_id(self._format, Callback("POST", "", None, raw))
        flood_key = self._flood.flood_key(_host_of(transport))
        await self._intake.keep(UnreadableCallback(raw, reason, peer, message_id or "", flood_key))
        self._metrics.unreadable.inc()
        log.warning(
            "callback_unreadable",
            reason=reason,
            peer=peer,
            payload_bytes=len(raw),
            message_id=message_id,
            coalesced=flood_key is not None,
        )

    def _receipt(
        self, fields: ReceiptFields, raw: bytes, peer: str | None, flags: tuple[str, ...]
    ) -> Receipt:
        """The domain receipt of a callback: the gateway's webhook body is the feed's Receipt
        without its two delivery fields (F4), which a callback does not have."""
        return Receipt(
            message_id=MessageId(fields["id"]),
            level=fields.get("level", 0),
            stat=fields.get("stat", ""),
            err=fields.get("err"),
            sub=fields.get("sub"),
            dlvrd=fields.get("dlvrd"),
            submit_date=fields.get("submit_date"),
            done_date=fields.get("done_date"),
            text=fields.get("text"),
            source_addr=fields.get("source_addr"),
            destination_addr=fields.get("destination_addr"),
            smsc_message_id=fields.get("smsc_message_id"),
            connector=fields.get("connector"),
            delivery_count=0,
            ack_token=AckToken(""),
            raw=raw,
            received_at=self._clock(),
            channel="webhook",
            peer=peer,
            flags=flags,
        )

    def _unavailable(self, reason: str) -> web.Response:
        return _text(
            503, f"not stored: {reason}; retry later\n", **{"Retry-After": self._retry_after}
        )


def _keep_partial(chunks: list[bytes], limit: int, what: str, status: int) -> None:
    """_Unreadable with the part of a body that arrived, if any did (nothing dropped)."""
    if chunks:
        raise _Unreadable(
            b"".join(chunks)[:limit],
            f"the body {what}; the part that arrived is kept, unread",
            status,
        )


def _decoded(body: bytes, encoding: str | None, limit: int) -> bytes:
    """The body without its Content-Encoding (gzip, deflate; none or identity as it is), at
    most `limit` bytes of it. _Unreadable, with the body as it came, otherwise."""
    name = (encoding or "identity").strip().lower()
    if name == "identity" or not body:
        return body
    wbits = _DECODERS.get(name)
    if wbits is None:
        raise _Unreadable(
            body,
            f"the body's Content-Encoding {name[:40]!r} is not one this receiver decodes "
            "(gzip, deflate); the body is kept as it came",
            415,
        )
    decoder = zlib.decompressobj(wbits)
    try:
        plain = decoder.decompress(body, limit + 1)
    except zlib.error as exc:
        raise _Unreadable(
            body, f"the body is not valid {name} ({exc}); the body is kept as it came", 400
        ) from None
    if len(plain) > limit:
        raise _Unreadable(
            body,
            f"the body is over --max-body-bytes ({limit} bytes) once decoded ({name}); the "
            "body is kept as it came",
            413,
        )
    if not decoder.eof:
        raise _Unreadable(
            body, f"the body is cut short as {name}; the body is kept as it came", 400
        )
    return plain


def _text(status: int, body: str, **headers: str) -> web.Response:
    return web.Response(status=status, text=body, headers=headers)


def _host_of(transport: asyncio.BaseTransport | None) -> str:
    """The host a connection came from (what a flood is counted by; never the forwarded
    addresses, which the caller chooses)."""
    peername = transport.get_extra_info("peername") if transport is not None else None
    return str(peername[0]) if peername else "unknown"


def _peer(request: web.Request) -> str | None:
    return _peer_of(request.transport, request.headers.get("X-Forwarded-For"))


def _peer_of(transport: asyncio.BaseTransport | None, forwarded: str | None) -> str | None:
    """`host:port` of the connection the callback came on and, when a proxy forwarded it, the
    addresses it names (`127.0.0.1:41990 for 203.0.113.9`). Evidence only: the forwarded part
    is what the caller claims, never used to decide anything."""
    peername = transport.get_extra_info("peername") if transport is not None else None
    if not peername:
        return None
    host, port = peername[0], peername[1]
    peer = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if forwarded:
        shown = "".join(c if c.isprintable() else "?" for c in forwarded[:_MAX_FORWARDED])
        peer += f" for {shown}"
    return peer

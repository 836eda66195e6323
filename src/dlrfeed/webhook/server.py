"""The HTTP side of `dlrfeed webhook`: a callback in, its reception committed, then the answer.

What each answer means to the gateway that posted (docs/webhook.md, "Answers"):
- 200: the reception is committed, whatever its outcome (applied, repeat, conflict,
  uncorrelated, ...): forget it.
- 400: the callback cannot be read as a receipt; its bytes are committed as evidence (C8). Do
  not retry: the same bytes again are the same open investigation.
- 413: the body is over --max-body-bytes; its first bytes are committed as evidence.
- 401: no valid secret; nothing stored (anybody could fill the queue otherwise).
- 404 / 405: another path or method; nothing stored.
- 503 + Retry-After: PostgreSQL cannot commit now, or too much is waiting; nothing stored:
  retry later.

Never a 2xx before the commit (P6: persist the reception before any effect), and never a 5xx
for a callback that is merely bad: a 5xx asks for a retry, which could not help it.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import structlog
from aiohttp import web

from dlrfeed.domain.receipt import AckToken, MessageId, Receipt
from dlrfeed.errors import StoreUnavailableError
from dlrfeed.webhook.formats import (
    Callback,
    CallbackFormat,
    MalformedCallback,
    ReceiptFields,
    evidence,
    read_callback,
)

if TYPE_CHECKING:
    from dlrfeed.domain.status import Outcome
    from dlrfeed.webhook.metrics import WebhookMetrics

log = structlog.get_logger("dlrfeed.webhook")

PATHS = ("/", "/dlr")
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


class EvidenceStore(Protocol):
    """What the server needs of `dlrfeed.store.Store` besides the intake."""

    async def keep_unreadable_callback(
        self, login: str, raw: bytes, reason: str, *, peer: str | None
    ) -> None: ...


class CallbackServer:
    """The aiohttp application of the receiver; `app` is served by the composition root."""

    def __init__(
        self,
        *,
        login: str,
        callback_format: CallbackFormat,
        intake: Intake,
        store: EvidenceStore,
        metrics: WebhookMetrics,
        secret: bytes | None,
        max_body_bytes: int,
        retry_after: int,
        max_in_hand: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._login = login
        self._format = callback_format
        self._intake = intake
        self._store = store
        self._metrics = metrics
        self._secret = secret
        self._max_body_bytes = max_body_bytes
        self._retry_after = str(retry_after)
        self._max_in_hand = max_in_hand
        self._clock = clock
        self.app = web.Application()
        for path in PATHS:
            self.app.router.add_route("*", path, self._handle)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        response = await self._answer(request)
        self._metrics.requests.labels(code=str(response.status)).inc()
        return response

    async def _answer(self, request: web.Request) -> web.Response:
        if request.method not in _METHODS[self._format]:
            allowed = ", ".join(sorted(_METHODS[self._format]))
            return _text(405, f"{request.method} is not a callback here\n", Allow=allowed)
        if not self._authorized(request.headers.get("Authorization")):
            log.warning("callback_unauthorized", peer=_peer(request))
            return _text(
                401,
                "a valid secret is required (Bearer token or Basic password)\n",
                **{"WWW-Authenticate": 'Basic realm="dlrfeed", charset="UTF-8"'},
            )
        if self._intake.in_hand >= self._max_in_hand:
            # Shed load before reading the body: the commits are behind; the gateway retries.
            return self._unavailable("too many callbacks waiting for a commit")
        started = time.monotonic()
        body, whole = await self._read_body(request)
        peer = _peer(request)
        callback = Callback(
            method=request.method,
            query=request.raw_path.partition("?")[2],
            content_type=request.headers.get("Content-Type"),
            body=body,
        )
        raw = evidence(callback)
        try:
            if not whole:
                reason = (
                    f"the body is over --max-body-bytes ({self._max_body_bytes} bytes); its "
                    f"first {self._max_body_bytes} bytes are kept"
                )
                return await self._keep_unreadable(raw, reason, peer, status=413)
            try:
                fields = read_callback(self._format, callback)
            except MalformedCallback as exc:
                return await self._keep_unreadable(raw, str(exc), peer, status=400)
            outcome = await self._intake.take(self._receipt(fields, raw, peer))
        except StoreUnavailableError:
            # The reason is in the log (store_unavailable); the caller learns only to retry.
            return self._unavailable("the store cannot take callbacks now")
        finally:
            self._metrics.answer_seconds.observe(time.monotonic() - started)
        success = _SUCCESS_BODY[self._format]
        if success is None:
            return web.json_response({"outcome": outcome.value})
        return _text(200, success)

    def _authorized(self, header: str | None) -> bool:
        """Bearer SECRET, or Basic with SECRET as the password (any user name), compared in
        constant time; every request passes when no secret is set."""
        if self._secret is None:
            return True
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
        return hmac.compare_digest(presented, self._secret)

    async def _read_body(self, request: web.Request) -> tuple[bytes, bool]:
        """The body, at most --max-body-bytes of it, and whether that is all of it."""
        limit = self._max_body_bytes
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_any():
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return b"".join(chunks)[:limit], False
        return b"".join(chunks), True

    def _receipt(self, fields: ReceiptFields, raw: bytes, peer: str | None) -> Receipt:
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
        )

    async def _keep_unreadable(
        self, raw: bytes, reason: str, peer: str | None, *, status: int
    ) -> web.Response:
        """C8: the bytes committed as evidence first, then the answer that stops retries."""
        await self._store.keep_unreadable_callback(self._login, raw, reason, peer=peer)
        self._metrics.unreadable.inc()
        log.warning("callback_unreadable", reason=reason, peer=peer, payload_bytes=len(raw))
        return _text(status, f"{reason}; kept as evidence, do not retry\n")

    def _unavailable(self, reason: str) -> web.Response:
        return _text(
            503, f"not stored: {reason}; retry later\n", **{"Retry-After": self._retry_after}
        )


def _text(status: int, body: str, **headers: str) -> web.Response:
    return web.Response(status=status, text=body, headers=headers)


def _peer(request: web.Request) -> str | None:
    """`host:port` of the connection the callback came on and, when a proxy forwarded it, the
    addresses it names (`127.0.0.1:41990 for 203.0.113.9`). Evidence only: the forwarded part
    is what the caller claims, never used to decide anything."""
    transport = request.transport
    peername = transport.get_extra_info("peername") if transport is not None else None
    if not peername:
        return None
    host, port = peername[0], peername[1]
    peer = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    forwarded = request.headers.get("X-Forwarded-For")
    if forwarded:
        shown = "".join(c if c.isprintable() else "?" for c in forwarded[:_MAX_FORWARDED])
        peer += f" for {shown}"
    return peer

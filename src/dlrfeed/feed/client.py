"""The gateway's ReceiptFeed as dlrfeed sees it: domain receipts in, project errors out.

`FeedClient` is the only place that touches the generated stubs. It turns each proto `Receipt`
into a `dlrfeed.domain.receipt.Receipt` (keeping the serialized bytes whole as `raw`, P6/P9) and
every failed call (`grpc.aio.AioRpcError`, or the `grpc.RpcError` of a Subscribe stream) into one
of the project's exception types, so that retry policies elsewhere match only those (STYLE:
translate errors at the boundary).
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import grpc
import grpc.aio

from dlrfeed.domain.receipt import Receipt
from dlrfeed.errors import (
    AuthenticationError,
    ConfigError,
    DlrfeedError,
    FatalError,
    FeedUnavailableError,
)
from dlrfeed.feed.wire import pull_receipts, receipt_from_wire
from dlrfeed.feed.wire import receipt_from_proto as receipt_from_proto  # moved; name kept
from gateway.receipts.v1 import feed_pb2

_SERVICE = "/gateway.receipts.v1.ReceiptFeed/"
MAX_ACK_TOKENS = 1000  # F9: more is INVALID_ARGUMENT
MAX_PULL = 1000  # F10
MAX_PULL_WAIT_SECONDS = 20  # F10

_TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        # A server-side cancel (the gateway shutting a stream down), not ours: reconnect.
        grpc.StatusCode.CANCELLED,
    }
)
# grpcio's words for a connection it could not open itself, and those in its reason that mean
# the TLS handshake, not the network, failed. An UNAVAILABLE a proxy sends about its own TLS
# hop to the gateway lacks the first: that one is retried like any other.
_OWN_CONNECT_FAILURE = "failed to connect to all addresses"
_TLS_FAILURE_MARKERS = ("ssl", "tls", "certificate", "handshake", "verification")


class FeedUnimplementedError(FatalError):
    """The gateway does not implement an RPC (e.g. Subscribe disabled); auto mode uses Pull."""


class FeedTlsError(ConfigError):
    """The TLS handshake with the gateway failed: wrong CA, wrong name, or a plaintext server."""


def translate_rpc_error(exc: grpc.Call | grpc.aio.AioRpcError, rpc: str) -> DlrfeedError:
    """The project's error for a failed call of `rpc`; the message never carries credentials."""
    return translate_status(exc.code(), exc.details() or "", rpc)


def translate_status(code: grpc.StatusCode, details: str, rpc: str) -> DlrfeedError:
    """The project's error for status `code` of `rpc`, whichever library reported it."""
    details = details.strip()
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return AuthenticationError(
            f"the gateway refused the login ({code.name} on {rpc}): check --login and the "
            "password (--password-file, DLRFEED_PASSWORD or the systemd credential)"
        )
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return FeedUnimplementedError(f"the gateway does not implement {rpc}")
    lowered = details.lower()
    if (
        code == grpc.StatusCode.UNAVAILABLE
        and _OWN_CONNECT_FAILURE in lowered
        and any(marker in lowered for marker in _TLS_FAILURE_MARKERS)
    ):
        return FeedTlsError(
            f"TLS handshake with the gateway failed on {rpc}: {details[:300]} — check --tls, "
            "--ca-file and --client-cert/--client-key"
        )
    if code in _TRANSIENT_CODES:
        return FeedUnavailableError(f"{rpc} failed: {code.name}: {details[:300]}")
    return FatalError(f"{rpc} failed: {code.name}: {details[:300]}")


@dataclass(frozen=True, slots=True)
class AckOutcome:
    """What one Ack call reported: removed now, and already gone (F9: not an error)."""

    acked: int
    already_gone: int


class SubscribeStream:
    """One open Subscribe call: `read()` the receipts that have arrived, `cancel()` to end it
    (F7 releases).

    A thread of the stream's own takes the messages off the call (a synchronous call of
    `open_stream_channel`) and queues their bytes; it wakes the event loop only when it queues
    into an empty queue. So the loop pays one wake-up per *group* of messages - all that arrived
    while it was busy - and decodes and hands on the group at once, like a Pull's response. The
    queue holds at most `window` receipts: the gateway sends no more until some are acked (F11).
    """

    def __init__(
        self, call: grpc.CallIterator[bytes], loop: asyncio.AbstractEventLoop, name: str
    ) -> None:
        self._call = call
        self._loop = loop
        self._arrived: deque[bytes] = deque()
        self._wakeup = asyncio.Event()
        self._ended = False
        self._error: BaseException | None = None  # how the call ended, when not cleanly
        self._cancelled_by_us = False
        self._thread = threading.Thread(target=self._take_messages, name=name, daemon=True)
        self._thread.start()

    async def read(self) -> list[Receipt] | None:
        """Every receipt that has arrived since the last read, oldest first (at least one; waits
        for it), or None when the gateway ended the stream cleanly.

        Raises the project's error for a failed stream, once the receipts that came before the
        failure have been read. When `cancel()` ended the call, raises `asyncio.CancelledError`
        (as grpc.aio does); `cancelled_by_us` tells it apart from a cancellation of the awaiting
        task.
        """
        while not self._arrived:
            if self._cancelled_by_us:
                raise asyncio.CancelledError
            if self._ended:
                if self._error is None:
                    return None
                if isinstance(self._error, grpc.RpcError):
                    raise translate_rpc_error(cast(grpc.Call, self._error), "Subscribe")
                raise self._error
            self._wakeup.clear()
            await self._wakeup.wait()
        if self._cancelled_by_us:
            raise asyncio.CancelledError
        received_at = time.time()
        arrived = self._arrived
        # popleft, not a copy then clear(): the thread may append meanwhile.
        # C8: bytes the strict decoder refuses still become a receipt (dlrfeed.feed.wire).
        return [receipt_from_wire(arrived.popleft(), received_at) for _ in range(len(arrived))]

    @property
    def cancelled_by_us(self) -> bool:
        return self._cancelled_by_us

    def cancel(self) -> None:
        """End the stream: the call is reset (RST_STREAM), and the gateway releases its unacked
        receipts at once (F7). The thread sees the call cancelled and ends."""
        self._cancelled_by_us = True
        self._call.cancel()  # type: ignore[no-untyped-call]  # unannotated in grpc-stubs
        self._wakeup.set()

    def _take_messages(self) -> None:
        """The stream's thread: queue each message's bytes, wake the loop on the first of a
        group, and record how the call ended."""
        arrived = self._arrived
        try:
            for raw in self._call:
                arrived.append(raw)
                if len(arrived) == 1:
                    self._wake()
        except BaseException as exc:  # noqa: BLE001 - handed to the loop, raised by read()
            self._error = exc
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._wakeup.set)
        except RuntimeError:
            return  # the loop is closed: nobody reads any more


class FeedClient:
    """The ReceiptFeed RPCs of one login over one channel, in domain types."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        login: str,
        password: str,
        *,
        stream_channel: grpc.Channel | None = None,
        ack_timeout: float = 10.0,
    ) -> None:
        credential = base64.b64encode(f"{login}:{password}".encode()).decode("ascii")
        # The only copy of the secret lives in this tuple; it is never logged or repr'd.
        self.__metadata = (("authorization", f"Basic {credential}"),)
        self._ack_timeout = ack_timeout
        # Subscribe keeps each message's bytes as received: `Receipt.raw` is exactly what the
        # gateway sent, and an undecodable one still becomes a receipt (C8). Without a stream
        # channel (`open_stream_channel`) the client can Pull and Ack only.
        self._subscribe = (
            None
            if stream_channel is None
            else stream_channel.unary_stream(
                _SERVICE + "Subscribe",
                request_serializer=feed_pb2.SubscribeRequest.SerializeToString,
                response_deserializer=None,
            )
        )
        self._streams = 0
        self._pull = channel.unary_unary(
            _SERVICE + "Pull",
            request_serializer=feed_pb2.PullRequest.SerializeToString,
            # Each receipt decoded on its own (dlrfeed.feed.wire): one undecodable receipt
            # must not fail the whole response and stall the 999 others with it (C8).
            response_deserializer=pull_receipts,
        )
        self._ack = channel.unary_unary(
            _SERVICE + "Ack",
            request_serializer=feed_pb2.AckRequest.SerializeToString,
            response_deserializer=feed_pb2.AckResponse.FromString,
        )

    def __repr__(self) -> str:
        return "FeedClient(<credentials redacted>)"

    def subscribe(self, window: int) -> SubscribeStream:
        """Open a Subscribe stream holding at most `window` unacked receipts (F11); must be
        called inside the running loop, which `SubscribeStream.read()` then wakes."""
        if self._subscribe is None:
            raise TypeError("this FeedClient has no stream_channel: it cannot Subscribe")
        call = self._subscribe(feed_pb2.SubscribeRequest(window=window), metadata=self.__metadata)
        self._streams += 1
        return SubscribeStream(call, asyncio.get_running_loop(), f"subscribe-{self._streams}")

    def pull(self, max_receipts: int, wait_seconds: int) -> PullCall:
        """Start one long-poll Pull (F10); await `PullCall.receipts()` for its result."""
        request = feed_pb2.PullRequest(
            max=min(max_receipts, MAX_PULL), wait_seconds=min(wait_seconds, MAX_PULL_WAIT_SECONDS)
        )
        call = self._pull(request, metadata=self.__metadata, timeout=wait_seconds + 15.0)
        return PullCall(call)

    async def ack(self, tokens: Sequence[str]) -> AckOutcome:
        """Ack up to 1000 tokens in one call; `already_gone` tokens count as done (F9)."""
        if not 0 < len(tokens) <= MAX_ACK_TOKENS:
            raise ValueError(f"an Ack carries 1..{MAX_ACK_TOKENS} tokens, not {len(tokens)}")
        try:
            response = await self._ack(
                feed_pb2.AckRequest(tokens=tokens),
                metadata=self.__metadata,
                timeout=self._ack_timeout,
            )
        except grpc.aio.AioRpcError as exc:
            raise translate_rpc_error(exc, "Ack") from None
        return AckOutcome(acked=response.acked, already_gone=len(response.already_gone))

    async def check_access(self, deadline_s: float = 10.0) -> None:
        """Prove the gateway is reachable, TLS verifies and the login is accepted.

        Sends an Ack with no token, which a healthy gateway answers INVALID_ARGUMENT (F9) without
        touching the queue; raises AuthenticationError, FeedTlsError or FeedUnavailableError.
        """
        try:
            await self._ack(
                feed_pb2.AckRequest(tokens=[]), metadata=self.__metadata, timeout=deadline_s
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                return
            raise translate_rpc_error(exc, "Ack") from None


class PullCall:
    """One Pull in flight; `cancel()` abandons it (its receipts come back after the lease, F6)."""

    def __init__(self, call: grpc.aio.UnaryUnaryCall[feed_pb2.PullRequest, list[bytes]]) -> None:
        self._call = call
        self._cancelled_by_us = False

    async def receipts(self) -> list[Receipt]:
        """The pulled receipts, oldest first (possibly none after a long poll)."""
        try:
            response = await self._call
        except grpc.aio.AioRpcError as exc:
            raise translate_rpc_error(exc, "Pull") from None
        received_at = time.time()
        # Each receipt's bytes exactly as they were inside the PullResponse are its evidence.
        return [receipt_from_wire(raw, received_at) for raw in response]

    @property
    def cancelled_by_us(self) -> bool:
        return self._cancelled_by_us

    def cancel(self) -> None:
        self._cancelled_by_us = True
        self._call.cancel()


def is_own_cancellation(cancelled_by_us: bool) -> bool:
    """True when a CancelledError came from our `cancel()` of a call, not of the running task."""
    task = asyncio.current_task()
    return cancelled_by_us and (task is None or task.cancelling() == 0)

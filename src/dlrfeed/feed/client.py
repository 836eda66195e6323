"""The gateway's ReceiptFeed as dlrfeed sees it: domain receipts in, project errors out.

`FeedClient` is the only place that touches the generated stubs. It turns each proto `Receipt`
into a `dlrfeed.domain.receipt.Receipt` (keeping the serialized bytes whole as `raw`, P6/P9) and
every failed call (`grpc.aio.AioRpcError`) into one of the project's exception types, so that
retry policies elsewhere match only those (STYLE: translate errors at the boundary).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Sequence
from dataclasses import dataclass

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
    """One open Subscribe call: `read()` its receipts one stream message at a time, `cancel()`
    to end it (F7 releases).

    The gateway sends no more than the window (F11) before some are acked, and grpcio no more
    bytes than the call's flow-control window before the reader takes what it has.
    """

    def __init__(self, call: grpc.aio.UnaryStreamCall[feed_pb2.SubscribeRequest, bytes]) -> None:
        self._call = call
        self._cancelled_by_us = False

    async def read(self) -> list[Receipt] | None:
        """The next receipt (waits for it) as a one-receipt list, or None when the gateway ended
        the stream cleanly.

        Raises the project's error for a failed stream, once the receipts that came before the
        failure have been read. When `cancel()` ended the call, raises `asyncio.CancelledError`
        (as grpc.aio does); `cancelled_by_us` tells it apart from a cancellation of the awaiting
        task.
        """
        try:
            raw = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise translate_rpc_error(exc, "Subscribe") from None
        if not isinstance(raw, bytes):  # grpc.aio.EOF: the gateway ended the stream cleanly
            return None
        # C8: bytes the strict decoder refuses still become a receipt (dlrfeed.feed.wire).
        return [receipt_from_wire(raw, time.time())]

    @property
    def cancelled_by_us(self) -> bool:
        return self._cancelled_by_us

    def cancel(self) -> None:
        """End the stream: the call is reset (RST_STREAM), and the gateway releases its unacked
        receipts at once (F7)."""
        self._cancelled_by_us = True
        self._call.cancel()


class FeedClient:
    """The ReceiptFeed RPCs of one login over one channel, in domain types."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        login: str,
        password: str,
        *,
        ack_timeout: float = 10.0,
    ) -> None:
        credential = base64.b64encode(f"{login}:{password}".encode()).decode("ascii")
        # The only copy of the secret lives in this tuple; it is never logged or repr'd.
        self.__metadata = (("authorization", f"Basic {credential}"),)
        self._ack_timeout = ack_timeout
        # Subscribe keeps each message's bytes as received: `Receipt.raw` is exactly what the
        # gateway sent, and an undecodable one still becomes a receipt (C8).
        self._subscribe = channel.unary_stream(
            _SERVICE + "Subscribe",
            request_serializer=feed_pb2.SubscribeRequest.SerializeToString,
            response_deserializer=None,
        )
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
        called inside the running loop."""
        request = feed_pb2.SubscribeRequest(window=window)
        return SubscribeStream(self._subscribe(request, metadata=self.__metadata))

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

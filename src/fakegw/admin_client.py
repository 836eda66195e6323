"""A typed client for fakegw's admin service, for tests, scripts and the demo.

    async with AdminClient("127.0.0.1:50051", "acme", "secret") as admin:
        await admin.inject([{"id": "m1", "level": 2, "stat": "DELIVRD"}])
        print(await admin.stats())

`SyncAdminClient` offers the same methods for synchronous code. The dlrfeed daemon never uses
this module: it is the gateway operator's side, not part of the feed contract.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

import grpc

ADMIN_SERVICE = "fakegw.admin.v1.Admin"
JsonObject = dict[str, Any]


def basic_auth_metadata(login: str, password: str) -> tuple[tuple[str, str], ...]:
    """gRPC metadata carrying `authorization: Basic base64(login:password)`."""
    encoded = base64.b64encode(f"{login}:{password}".encode()).decode("ascii")
    return (("authorization", f"Basic {encoded}"),)


def loopback_login_metadata(login: str) -> tuple[tuple[str, str], ...]:
    """Admin-only metadata naming a login without its password (accepted from loopback only)."""
    return (("fakegw-login", login),)


def _metadata(login: str, password: str | None) -> tuple[tuple[str, str], ...]:
    if password is None:
        return loopback_login_metadata(login)
    return basic_auth_metadata(login, password)


def _encode(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _decode(payload: bytes) -> JsonObject:
    value = json.loads(payload.decode("utf-8"))
    assert isinstance(value, dict)
    return value


class AdminClient:
    """Async admin client; acts on the login whose credentials it carries.

    With `password=None` it names the login in `fakegw-login` metadata, which the server
    accepts from loopback peers only (see fakegw.admin).
    """

    def __init__(
        self, target: str, login: str, password: str | None, timeout: float = 30.0
    ) -> None:
        self._channel = grpc.aio.insecure_channel(
            target, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
        )
        self._metadata = _metadata(login, password)
        self._timeout = timeout

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(grace=None)

    async def call(self, method: str, request: Mapping[str, Any] | None = None) -> JsonObject:
        """Call one admin method by name with a JSON object; raises grpc.aio.AioRpcError."""
        stub = self._channel.unary_unary(
            f"/{ADMIN_SERVICE}/{method}",
            request_serializer=_encode,
            response_deserializer=_decode,
        )
        response: JsonObject = await stub(
            request or {}, metadata=self._metadata, timeout=self._timeout
        )
        return response

    async def inject(self, receipts: Iterable[Mapping[str, Any]]) -> JsonObject:
        """Enqueue receipts (webhook bodies), or POST those with a `dlr_url` there (F2);
        `{"enqueued", "dropped_at_cap", "callbacks"}`."""
        return await self.call("Inject", {"receipts": list(receipts)})

    async def send(self, messages: Iterable[Mapping[str, Any]]) -> JsonObject:
        """Register sent messages (`id`, `dlr`, `dlr_level`, `dlr_url`, `channel`, `sent_at`)."""
        return await self.call("Send", {"messages": list(messages)})

    async def report(self, receipts: Iterable[Mapping[str, Any]]) -> JsonObject:
        """Network receipts for sent messages; enqueued, or POSTed to the `dlr_url`, where F2
        says so."""
        return await self.call("Report", {"receipts": list(receipts)})

    async def stats(self) -> JsonObject:
        """Queue counters of this login (`queued`, `in_flight`, `acked`, ...)."""
        return await self.call("Stats")

    async def ledger(self, after: int = 0, limit: int = 10_000) -> JsonObject:
        """One page of ledger records after id `after`: `{"records": [...], "next": id}`."""
        return await self.call("Ledger", {"after": after, "limit": limit})

    async def ledger_all(self) -> list[JsonObject]:
        """Every ledger record of this login, reading page after page."""
        records: list[JsonObject] = []
        after = 0
        while True:
            page = await self.ledger(after)
            records.extend(page["records"])
            if page["next"] == after:
                return records
            after = page["next"]

    async def faults(self, **changes: Any) -> JsonObject:
        """Change fault knobs at runtime (none = just read them); returns the current knobs."""
        return await self.call("Faults", {"set": changes})

    async def sweep(self) -> JsonObject:
        """Run lease expiry, retention and the receipt deadline now."""
        return await self.call("Sweep")


class SyncAdminClient:
    """Synchronous twin of AdminClient over a blocking channel."""

    def __init__(
        self, target: str, login: str, password: str | None, timeout: float = 30.0
    ) -> None:
        self._channel = grpc.insecure_channel(
            target, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
        )
        self._metadata = _metadata(login, password)
        self._timeout = timeout

    def __enter__(self) -> SyncAdminClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def call(self, method: str, request: Mapping[str, Any] | None = None) -> JsonObject:
        """Call one admin method by name with a JSON object; raises grpc.RpcError."""
        stub = self._channel.unary_unary(
            f"/{ADMIN_SERVICE}/{method}",
            request_serializer=_encode,
            response_deserializer=_decode,
        )
        response: JsonObject = stub(request or {}, metadata=self._metadata, timeout=self._timeout)
        return response

    def inject(self, receipts: Iterable[Mapping[str, Any]]) -> JsonObject:
        """Enqueue receipts (webhook bodies), or POST those with a `dlr_url` there (F2);
        `{"enqueued", "dropped_at_cap", "callbacks"}`."""
        return self.call("Inject", {"receipts": list(receipts)})

    def send(self, messages: Iterable[Mapping[str, Any]]) -> JsonObject:
        """Register sent messages for F2/F3 simulation."""
        return self.call("Send", {"messages": list(messages)})

    def report(self, receipts: Iterable[Mapping[str, Any]]) -> JsonObject:
        """Network receipts for sent messages; enqueued, or POSTed to the `dlr_url`, where F2
        says so."""
        return self.call("Report", {"receipts": list(receipts)})

    def stats(self) -> JsonObject:
        """Queue counters of this login."""
        return self.call("Stats")

    def ledger(self, after: int = 0, limit: int = 10_000) -> JsonObject:
        """One page of ledger records after id `after`."""
        return self.call("Ledger", {"after": after, "limit": limit})

    def faults(self, **changes: Any) -> JsonObject:
        """Change fault knobs at runtime; returns the current knobs."""
        return self.call("Faults", {"set": changes})

    def sweep(self) -> JsonObject:
        """Run lease expiry, retention and the receipt deadline now."""
        return self.call("Sweep")

"""The admin service `fakegw.admin.v1.Admin`, served on the feed's port.

Every method is unary-unary with a JSON object as request and response body (UTF-8 bytes), so
no extra proto is needed; callers authenticate with the same Basic credentials as the feed and
act on their own login. Methods:

| method   | request                                  | response                              |
| -------- | ---------------------------------------- | ------------------------------------- |
| `Inject` | `{"receipts": [webhook body, ...]}`      | `{"enqueued", "dropped_at_cap", ...}` |
| `Send`   | `{"messages": [sent message, ...]}`      | `{"registered"}`                      |
| `Report` | `{"receipts": [webhook body, ...]}`      | `{"enqueued", "callbacks", ...}`      |
| `Stats`  | `{}`                                     | counters (`queued`, `in_flight`, ...) |
| `Ledger` | `{"after": id, "limit": n}`              | `{"records": [...], "next": id}`      |
| `Faults` | `{"set": {knob: value, ...}}` (optional) | the current knobs                     |
| `Sweep`  | `{}`                                     | `{}` after leases/retention/deadline  |

An `Inject` body that also carries `dlr_url` is POSTed to that URL instead of being queued (F2:
the webhook wins); `callbacks` in the answer counts them. Malformed requests answer
INVALID_ARGUMENT with the reason.

Authentication: the login's Basic credentials, exactly as on the feed. For command-line
convenience (docs/spec/interfaces.md §2: `fakegw inject --login NAME` takes no password) a
caller on the loopback interface may instead name a configured login in metadata
`fakegw-login`. The feed itself never accepts that header.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

import grpc

from fakegw.faults import Faults

ADMIN_SERVICE = "fakegw.admin.v1.Admin"
JsonObject = dict[str, Any]


class AdminTarget(Protocol):
    """What the admin service needs of a gateway, and nothing more."""

    @property
    def faults(self) -> Faults:
        """The gateway's fault knobs, changed in place."""
        ...

    def has_login(self, login: str) -> bool:
        """Whether `login` is configured."""
        ...

    async def authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """The login whose Basic credentials the call carries (FD1), else abort."""
        ...

    async def inject(self, login: str, bodies: Iterable[Mapping[str, object]]) -> dict[str, int]:
        """Enqueue receipts given as webhook bodies; POST those with a `dlr_url` there (F2)."""
        ...

    async def send(self, login: str, messages: Iterable[Mapping[str, Any]]) -> dict[str, int]:
        """Register sent messages (F2, F3)."""
        ...

    async def report(self, login: str, bodies: Iterable[Mapping[str, object]]) -> dict[str, int]:
        """Network receipts for sent messages: to the feed or the `dlr_url`, as F2 says."""
        ...

    def stats(self, login: str) -> dict[str, int]:
        """The login's queue counters."""
        ...

    def ledger(self, login: str | None, after: int, limit: int) -> dict[str, Any]:
        """One page of ledger records."""
        ...

    async def sweep(self) -> None:
        """Run lease expiry, retention and the receipt deadline now."""
        ...


AdminMethod = Callable[[AdminTarget, str, JsonObject], Awaitable[JsonObject]]


def _decode(payload: bytes) -> JsonObject:
    value = json.loads(payload.decode("utf-8")) if payload else {}
    if not isinstance(value, dict):
        raise TypeError("the request body must be a JSON object")
    return value


def _encode(value: JsonObject) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _list_of_objects(request: JsonObject, key: str) -> list[dict[str, Any]]:
    items = request.get(key, [])
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ValueError(f"{key!r} must be a list of JSON objects")
    return items


async def _inject(gw: AdminTarget, login: str, request: JsonObject) -> JsonObject:
    return dict(await gw.inject(login, _list_of_objects(request, "receipts")))


async def _send(gw: AdminTarget, login: str, request: JsonObject) -> JsonObject:
    return dict(await gw.send(login, _list_of_objects(request, "messages")))


async def _report(gw: AdminTarget, login: str, request: JsonObject) -> JsonObject:
    return dict(await gw.report(login, _list_of_objects(request, "receipts")))


async def _stats(gw: AdminTarget, login: str, request: JsonObject) -> JsonObject:
    return dict(gw.stats(login))


async def _ledger(gw: AdminTarget, login: str, request: JsonObject) -> JsonObject:
    after = int(request.get("after", 0))
    limit = int(request.get("limit", 10_000))
    return gw.ledger(login, after, limit)


async def _faults(gw: AdminTarget, login: str, request: JsonObject) -> JsonObject:
    changes = request.get("set", {})
    if not isinstance(changes, dict):
        raise TypeError("'set' must be a JSON object")
    gw.faults.update(changes)
    return gw.faults.to_dict()


async def _sweep(gw: AdminTarget, login: str, request: JsonObject) -> JsonObject:
    await gw.sweep()
    return {}


ADMIN_METHODS: dict[str, AdminMethod] = {
    "Inject": _inject,
    "Send": _send,
    "Report": _report,
    "Stats": _stats,
    "Ledger": _ledger,
    "Faults": _faults,
    "Sweep": _sweep,
}


LOGIN_HEADER = "fakegw-login"


def _is_loopback(peer: str) -> bool:
    return peer.startswith(("ipv4:127.", "ipv6:[::1]", "ipv6:%5B::1%5D", "unix:"))


def _loopback_login(gw: AdminTarget, context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == LOGIN_HEADER and isinstance(value, str) and gw.has_login(value):
            return value if _is_loopback(context.peer()) else None
    return None


def admin_handler(gw: AdminTarget) -> grpc.GenericRpcHandler[Any, Any]:
    """The admin service's grpc handler, every method bound to one gateway."""

    def bind(method: AdminMethod) -> Callable[..., Awaitable[bytes]]:
        async def handle(payload: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            login = _loopback_login(gw, context)
            if login is None:
                login = await gw.authenticate(context)
            try:
                request = _decode(payload)
                response = await method(gw, login, request)
            except (ValueError, TypeError) as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return _encode(response)

        return handle

    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            bind(method), request_deserializer=None, response_serializer=None
        )
        for name, method in ADMIN_METHODS.items()
    }
    return grpc.method_handlers_generic_handler(ADMIN_SERVICE, handlers)

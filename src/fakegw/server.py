"""The fake gateway: a grpc.aio server speaking `gateway.receipts.v1.ReceiptFeed` (F1-F16).

`FakeGateway` is both the daemon behind `fakegw serve` and an in-process test fixture:

    async with FakeGateway({"acme": "secret"}, lease_seconds=2).running() as gw:
        await gw.inject("acme", [{"id": "m1", "level": 2, "stat": "DELIVRD"}])
        ... connect a client to gw.target ...
        assert gw.stats("acme")["acked"] == 1

The same port also serves the admin service `fakegw.admin.v1.Admin` (JSON bodies, see
fakegw.admin), used by `fakegw inject|send|stats` and by tests in other processes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import heapq
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc

from fakegw.faults import Faults
from fakegw.persistence import NullPersistence, SqlitePersistence, dumps
from fakegw.queue import Entry, Holder, LoginQueue
from fakegw.sending import SentMessage, parse_sent_message, smpp_date
from fakegw.shared import SharedStore
from fakegw.tokens import TokenSigner
from fakegw.wire import (
    ReceiptFields,
    delivery_bytes,
    encode_fields,
    normalize_fields,
    pull_response_bytes,
    token_field,
)
from gateway.receipts.v1 import feed_pb2

FEED_SERVICE = "gateway.receipts.v1.ReceiptFeed"
ADMIN_SERVICE = "fakegw.admin.v1.Admin"
MAX_PULL = 1000  # F10
MAX_PULL_WAIT_SECONDS = 20  # F10
MAX_ACK_TOKENS = 1000  # F9
# A stream leases at most this many receipts per step, so acks and other readers interleave.
_STREAM_STEP = 64

LedgerRecord = tuple[int, str, str, int, str, float, ReceiptFields]


def _identity(payload: bytes) -> bytes:
    return payload


MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The gateway's default gRPC message limit; dlrfeed's receive limit is at least this on
purpose: whatever the gateway can send, the daemon accepts (docs/security.md)."""


class FakeGateway:
    """A fake SMS gateway receipt feed with durable per-login queues and seedable faults."""

    def __init__(
        self,
        logins: Mapping[str, str],
        *,
        store: str = ":memory:",
        shared_store: bool = False,
        shared_poll_seconds: float = 0.05,
        lease_seconds: float = 120.0,
        max_window: int = 1000,
        cap: int = 1_000_000,
        retention_seconds: float = 604_800.0,
        dlr_deadline_seconds: float = 86_400.0,
        faults: Faults | None = None,
        housekeeping_seconds: float | None = None,
        max_pull_wait_seconds: float = MAX_PULL_WAIT_SECONDS,
        ledger_max_records: int = 0,
        server_credentials: grpc.ServerCredentials | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        if not logins:
            raise ValueError("at least one login is needed")
        self._passwords = dict(logins)
        self.store = store
        if shared_store and store == ":memory:":
            raise ValueError("shared_store needs a store file")
        # --shared-store: SQLite, not this process, owns queues, leases and acks (fakegw.shared).
        self.shared_store = shared_store
        self.shared_poll_seconds = shared_poll_seconds
        self._shared: SharedStore | None = None
        self._shared_deadline_fields: dict[str, list[ReceiptFields]] = {}
        self._stream_numbers = 0
        self._watcher: asyncio.Task[None] | None = None
        self.lease_seconds = lease_seconds
        self.max_window = max_window
        self.cap = cap
        self.retention_seconds = retention_seconds
        self.dlr_deadline_seconds = dlr_deadline_seconds
        self.max_pull_wait_seconds = max_pull_wait_seconds
        self.faults = faults if faults is not None else Faults()
        # TLS (and mTLS when the credentials require client certificates); None = plaintext.
        self.server_credentials = server_credentials
        # gRPC send/receive limit of every message (docs/security.md): a receipt larger than
        # this cannot be sent; the call fails RESOURCE_EXHAUSTED.
        self.max_message_bytes = max_message_bytes
        # Leases, retention and deadlines are checked this often; short leases get short ticks.
        self.housekeeping_seconds = housekeeping_seconds or min(0.5, max(0.02, lease_seconds / 20))
        self.persistence: NullPersistence | SqlitePersistence = (
            NullPersistence() if store == ":memory:" else SqlitePersistence(store)
        )
        self.queues = {login: LoginQueue(login, lease_seconds, cap) for login in self._passwords}
        self._auth_cache: dict[str, str] = {}
        self._signer = TokenSigner(b"")
        self._next_seq = 1
        self._ledger: list[LedgerRecord] = []
        # A long demo would otherwise hold every receipt ever seen; 0 keeps everything.
        self.ledger_max_records = ledger_max_records
        self._ledger_dropped = 0  # records trimmed from memory; ids stay stable
        self._sent: dict[tuple[str, str], SentMessage] = {}
        self._deadlines: list[tuple[float, str, str]] = []
        self._server: grpc.aio.Server | None = None
        self._housekeeper: asyncio.Task[None] | None = None
        self._stopping = False
        self._started = False
        self.port = 0
        self.host = "127.0.0.1"

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def target(self) -> str:
        """`host:port` a client dials."""
        return f"{self.host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Load the store, bind `host:port` (0 = any free port) and serve; returns the port.

        An instance serves once: to restart on the same store, create a new FakeGateway.
        """
        if self._started:
            raise RuntimeError("a FakeGateway starts once; create a new one to restart")
        self._started = True
        self._load()
        if self.shared_store:
            self._shared = SharedStore(self.store, self._signer)
            self._shared.open()
        await self.persistence.start()
        server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
            ]
        )
        server.add_generic_rpc_handlers((self._feed_handler(), self._admin_handler()))
        bound = (
            server.add_secure_port(f"{host}:{port}", self.server_credentials)
            if self.server_credentials is not None
            else server.add_insecure_port(f"{host}:{port}")
        )
        if bound == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        await server.start()
        self._server = server
        self.host, self.port = host, bound
        self._housekeeper = asyncio.create_task(self._housekeeping(), name="fakegw-housekeeping")
        if self._shared is not None:
            self._watcher = asyncio.create_task(
                self._watch_shared(self._shared), name="fakegw-shared-watch"
            )
        return bound

    async def stop(self, grace: float | None = 0.2) -> None:
        """Stop serving: open streams end (F7 releases their receipts), the store is flushed."""
        self._stopping = True
        for queue in self.queues.values():
            queue.notify()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self._housekeeper is not None:
            self._housekeeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeper
            self._housekeeper = None
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        if self._shared is not None:
            # Runs after the stream releases queued on the store thread (F7), then closes.
            self._shared.close()
        await self.persistence.close()

    async def wait_for_termination(self) -> None:
        """Block until the server stops."""
        if self._server is not None:
            await self._server.wait_for_termination()

    @contextlib.asynccontextmanager
    async def running(self, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[FakeGateway]:
        """`async with gw.running() as gw:` starts the server and stops it on exit."""
        await self.start(host, port)
        try:
            yield self
        finally:
            await self.stop()

    def _load(self) -> None:
        state = self.persistence.load()
        self._signer = TokenSigner(state.hmac_key)
        max_seq = 0
        by_login: dict[str, list[Entry]] = {}
        if self.shared_store:
            # The store, not this process, holds the queues and the ledger (fakegw.shared).
            state.receipts, state.ledger = [], []
        for seq, login, fields_json, enqueued_at, delivery_count in state.receipts:
            max_seq = max(max_seq, seq)
            if login not in self.queues:
                continue  # a login no longer configured keeps its rows, unserved
            fields: ReceiptFields = json.loads(fields_json)
            token = self._signer.issue(login, seq)
            by_login.setdefault(login, []).append(
                Entry(
                    seq,
                    fields,
                    encode_fields(fields),
                    token,
                    token_field(token),
                    enqueued_at,
                    delivery_count,
                )
            )
        for login, entries in by_login.items():
            self.queues[login].restore(entries)
        for ledger_id, kind, login, seq, token, at, fields_json in state.ledger:
            max_seq = max(max_seq, seq)
            if not self._ledger:
                self._ledger_dropped = ledger_id - 1
            self._ledger.append((ledger_id, kind, login, seq, token, at, json.loads(fields_json)))
        self._trim_ledger()
        for login, message_id, message_json, sent_at, resolved in state.sent:
            message = parse_sent_message(login, json.loads(message_json), sent_at)
            message.resolved = bool(resolved)
            self._sent[(login, message_id)] = message
            if not message.resolved:
                heapq.heappush(
                    self._deadlines, (sent_at + self.dlr_deadline_seconds, login, message_id)
                )
        self._next_seq = max_seq + 1

    # -- authentication -------------------------------------------------------------------
    def _login_for(self, header: str) -> str | None:
        login = self._auth_cache.get(header)
        if login is not None:
            return login
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        name, sep, password = decoded.partition(":")
        expected = self._passwords.get(name)
        if not sep or expected is None:
            return None
        if not hmac.compare_digest(password.encode(), expected.encode()):
            return None
        self._auth_cache[header] = name
        return name

    async def authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> LoginQueue:
        """Spec "decided here": Basic credentials in metadata, else UNAUTHENTICATED."""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                login = self._login_for(value)
                if login is not None:
                    return self.queues[login]
                break
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong credentials")
        raise AssertionError("abort returns by raising")

    # -- enqueue --------------------------------------------------------------------------
    def _enqueue(self, queue: LoginQueue, fields: ReceiptFields, now: float) -> bool:
        """Put one receipt at the back of a login's queue; False if the cap dropped it (F15)."""
        if not queue.has_room():
            queue.counters.dropped_at_cap += 1
            return False
        seq = self._next_seq
        self._next_seq = seq + 1
        token = self._signer.issue(queue.login, seq)
        queue.add(Entry(seq, fields, encode_fields(fields), token, token_field(token), now, 0))
        self._record(queue.login, "enqueue", seq, token, now, fields)
        if self.persistence.durable:
            self.persistence.pending.receipts_insert.append(
                (seq, queue.login, dumps(fields), now, 0)
            )
        return True

    def _record(
        self, login: str, kind: str, seq: int, token: str, at: float, fields: ReceiptFields
    ) -> None:
        ledger_id = self._ledger_dropped + len(self._ledger) + 1
        self._ledger.append((ledger_id, kind, login, seq, token, at, fields))
        if self.ledger_max_records and len(self._ledger) > self.ledger_max_records * 11 // 10:
            self._trim_ledger()
        if self.persistence.durable:
            self.persistence.pending.ledger_insert.append(
                (ledger_id, kind, login, seq, token, at, dumps(fields))
            )

    def _trim_ledger(self) -> None:
        excess = len(self._ledger) - self.ledger_max_records
        if self.ledger_max_records and excess > 0:
            del self._ledger[:excess]
            self._ledger_dropped += excess

    def _enqueue_with_faults(self, queue: LoginQueue, fields: ReceiptFields, now: float) -> int:
        enqueued = int(self._enqueue(queue, fields, now))
        if self.faults.chance(self.faults.duplicate_rate):
            # Fault: the same id + level enqueued again (F8 says clients must dedupe).
            enqueued += int(self._enqueue(queue, dict(fields), now))
        return enqueued

    async def inject(self, login: str, bodies: Iterable[Mapping[str, object]]) -> dict[str, int]:
        """Enqueue receipts (webhook-body dicts, keys = Receipt fields 1-13) for `login`.

        Returns `{"enqueued": n, "dropped_at_cap": m}` once they are durable. Duplicate faults
        apply. All bodies are validated first, so a malformed one enqueues nothing (ValueError).
        """
        queue = self.queues[login]
        all_fields = [normalize_fields(body) for body in bodies]
        if self._shared is not None:
            return await self._enqueue_shared(queue, self._with_duplicates(all_fields))
        dropped_before = queue.counters.dropped_at_cap
        now = time.time()
        enqueued = sum(self._enqueue_with_faults(queue, fields, now) for fields in all_fields)
        queue.notify()
        await self.persistence.commit()
        return {
            "enqueued": enqueued,
            "dropped_at_cap": queue.counters.dropped_at_cap - dropped_before,
        }

    async def send(self, login: str, messages: Iterable[Mapping[str, Any]]) -> dict[str, int]:
        """Register sent messages (F2 inputs; F3 deadline starts at `sent_at`)."""
        queue = self.queues[login]
        now = time.time()
        parsed = [parse_sent_message(queue.login, body, now) for body in messages]
        for message in parsed:
            self._sent[(login, message.message_id)] = message
            heapq.heappush(
                self._deadlines,
                (message.sent_at + self.dlr_deadline_seconds, login, message.message_id),
            )
            if self.persistence.durable:
                self.persistence.pending.sent_upsert.append(
                    (login, message.message_id, dumps(message.to_json()), message.sent_at, 0)
                )
        await self.persistence.commit()
        return {"registered": len(parsed)}

    async def report(self, login: str, bodies: Iterable[Mapping[str, object]]) -> dict[str, int]:
        """The network reports receipts for sent messages; F2 decides which reach the feed.

        Returns counts: `enqueued`, `filtered` (F2 said no), `unknown_message` (never sent by
        this login; use `inject` to enqueue receipts for unknown ids), `dropped_at_cap`.
        """
        queue = self.queues[login]
        all_fields = [normalize_fields(body) for body in bodies]
        now = time.time()
        result = {"enqueued": 0, "filtered": 0, "unknown_message": 0, "dropped_at_cap": 0}
        dropped_before = queue.counters.dropped_at_cap
        shared_batch: list[ReceiptFields] = []
        for fields in all_fields:
            message = self._sent.get((login, str(fields.get("id", ""))))
            if message is None:
                result["unknown_message"] += 1
                continue
            level = int(fields.get("level", 0))
            if level == 2 and not message.resolved:
                message.resolved = True
                if self.persistence.durable:
                    self.persistence.pending.sent_resolve.append((login, message.message_id))
            if message.feed_wants(level):
                if self._shared is not None:
                    shared_batch.append(fields)
                    continue
                result["enqueued"] += self._enqueue_with_faults(queue, fields, now)
            else:
                result["filtered"] += 1
                queue.counters.filtered_by_f2 += 1
        result["dropped_at_cap"] = queue.counters.dropped_at_cap - dropped_before
        if self._shared is not None and shared_batch:
            counts = await self._enqueue_shared(queue, self._with_duplicates(shared_batch))
            result["enqueued"], result["dropped_at_cap"] = (
                counts["enqueued"],
                counts["dropped_at_cap"],
            )
        queue.notify()
        await self.persistence.commit()
        return result

    # -- inspection -----------------------------------------------------------------------
    def stats(self, login: str) -> dict[str, int]:
        """CONTRACT section 2 counters (`queued`, `in_flight`, `acked`, `redelivered`,
        `dropped_at_cap`) and more, for one login."""
        stats = self.queues[login].stats()
        if self._shared is not None:
            queued, in_flight = self._shared.sizes(login)
            stats.update(queued=queued, in_flight=in_flight, total=queued + in_flight)
        return stats

    def ledger(
        self, login: str | None = None, after: int = 0, limit: int = 10_000
    ) -> dict[str, Any]:
        """Ledger records with id > `after` (of `login`, or all), at most `limit`.

        Each record: `id`, `kind` ("enqueue" or "ack"), `login`, `seq`, `token`, `at` (epoch
        seconds), `receipt` (fields 1-13). `next` is the `after` for the following page.
        `first_id` is the oldest id still held (above 1 only with `ledger_max_records`).
        """
        records: list[dict[str, Any]] = []
        last = after
        if self._shared is not None:
            for ledger_id, kind, rec_login, seq, token, at, fields_json in self._shared.ledger_page(
                login, after, limit
            ):
                last = ledger_id
                receipt = json.loads(fields_json)
                records.append(_ledger_record(ledger_id, kind, rec_login, seq, token, at, receipt))
            return {"records": records, "next": last, "first_id": self._shared.first_ledger_id()}
        start = max(after - self._ledger_dropped, 0)
        for ledger_id, kind, rec_login, seq, token, at, fields in self._ledger[start:]:
            last = ledger_id
            if login is not None and rec_login != login:
                continue
            records.append(_ledger_record(ledger_id, kind, rec_login, seq, token, at, fields))
            if len(records) >= limit:
                break
        return {"records": records, "next": last, "first_id": self._ledger_dropped + 1}

    async def sweep(self) -> None:
        """Run lease expiry (F6), retention (F16) and the receipt deadline (F3) now."""
        now = time.time()
        cutoff = now - self.retention_seconds
        if self._shared is not None:
            await self._sweep_shared(self._shared, now, cutoff)
            return
        durable = self.persistence.durable
        for queue in self.queues.values():
            queue.expire_leases(now)
            removed = queue.expire_retention(cutoff)
            if removed and durable:
                self.persistence.pending.receipts_delete.extend((e.seq,) for e in removed)
        self._expire_deadlines(now)
        if durable:
            self.persistence.mark_dirty()

    def _expire_deadlines(self, now: float) -> None:
        touched: set[str] = set()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, login, message_id = heapq.heappop(self._deadlines)
            message = self._sent.get((login, message_id))
            if message is None or message.resolved:
                continue
            message.resolved = True
            if self.persistence.durable:
                self.persistence.pending.sent_resolve.append((login, message_id))
            queue = self.queues.get(login)
            if queue is None:
                continue
            if message.feed_wants(2) and self._shared is not None:
                self._shared_deadline_fields.setdefault(login, []).append(
                    {
                        "id": message_id,
                        "level": 2,
                        "stat": "UNKNOWN",
                        "submit_date": smpp_date(message.sent_at),
                        "done_date": smpp_date(now),
                    }
                )
            elif message.feed_wants(2):
                # F3: one last receipt, UNKNOWN, as a webhook would get it.
                fields: ReceiptFields = {
                    "id": message_id,
                    "level": 2,
                    "stat": "UNKNOWN",
                    "submit_date": smpp_date(message.sent_at),
                    "done_date": smpp_date(now),
                }
                if self._enqueue(queue, fields, now):
                    queue.counters.deadline_unknown += 1
                touched.add(login)
        for login in touched:
            self.queues[login].notify()

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(self.housekeeping_seconds)
            await self.sweep()

    # -- the feed -------------------------------------------------------------------------
    def _feed_handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        # The mode is chosen once here, so the default path carries no shared-mode branches.
        shared = self.shared_store
        handlers = {
            "Subscribe": grpc.unary_stream_rpc_method_handler(
                self._subscribe_shared if shared else self._subscribe,
                request_deserializer=feed_pb2.SubscribeRequest.FromString,
                response_serializer=_identity,
            ),
            "Pull": grpc.unary_unary_rpc_method_handler(
                self._pull_shared if shared else self._pull,
                request_deserializer=feed_pb2.PullRequest.FromString,
                response_serializer=_identity,
            ),
            "Ack": grpc.unary_unary_rpc_method_handler(
                self._ack_shared if shared else self._ack,
                request_deserializer=feed_pb2.AckRequest.FromString,
                response_serializer=feed_pb2.AckResponse.SerializeToString,
            ),
        }
        return grpc.method_handlers_generic_handler(FEED_SERVICE, handlers)

    def _note_deliveries(self, entries: Sequence[Entry]) -> None:
        if self.persistence.durable:
            # delivery_count survives a restart, so redelivery after kill -9 still counts up.
            self.persistence.pending.delivery_counts.extend(
                (e.delivery_count, e.seq) for e in entries
            )
            self.persistence.mark_dirty()

    async def _subscribe(
        self, request: feed_pb2.SubscribeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        queue = await self.authenticate(context)
        faults = self.faults
        if faults.no_subscribe:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Subscribe is switched off")
        # F11: unset or above the maximum means the maximum.
        window = request.window
        if window == 0 or window > self.max_window:
            window = self.max_window
        holder = Holder()
        queue.streams += 1
        sent = 0
        try:
            if faults.latency_ms:
                await asyncio.sleep(faults.latency_ms / 1000)
            while not self._stopping:
                changed = queue.changed_event()
                room = window - len(holder.held)
                if room > 0 and queue.ready:
                    batch = queue.take(min(room, _STREAM_STEP), holder, time.time())
                    if batch:
                        self._note_deliveries(batch)
                        for entry in batch:
                            yield delivery_bytes(
                                entry.base, entry.token_bytes, entry.delivery_count
                            )
                            sent += 1
                            if faults.cut_stream_every and sent % faults.cut_stream_every == 0:
                                await context.abort(
                                    grpc.StatusCode.UNAVAILABLE, "fault: stream cut"
                                )
                        continue
                # F11: at the window the stream pauses until acks arrive, on any channel.
                await changed.wait()
            # A gateway going down ends its streams with an error, as a restart would.
            await context.abort(grpc.StatusCode.UNAVAILABLE, "gateway shutting down")
        finally:
            queue.streams -= 1
            # F7: a stream that ends releases its unacked receipts at once.
            queue.release(holder)

    async def _admit_unary(self, context: grpc.aio.ServicerContext[Any, Any]) -> LoginQueue:
        """Authenticate a Pull or Ack, then apply the call faults (latency, UNAVAILABLE)."""
        queue = await self.authenticate(context)
        faults = self.faults
        if faults.latency_ms:
            await asyncio.sleep(faults.latency_ms / 1000)
        if faults.chance(faults.unavailable_rate):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fault: unavailable")
        return queue

    async def _long_poll(
        self,
        request: feed_pb2.PullRequest,
        queue: LoginQueue,
        take: Callable[[int], Awaitable[bytes]],
    ) -> bytes:
        """F10: `take(limit)` now, or again each time the queue changes, until `wait_seconds`.

        At most 1000 (unset means 1000) and at most 20 s; larger values are clamped. Returns as
        soon as `take` hands out receipts; an empty response when the wait runs out.
        """
        limit = min(request.max or MAX_PULL, MAX_PULL)
        wait = min(float(request.wait_seconds), self.max_pull_wait_seconds)
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + wait
        while True:
            changed = queue.changed_event()
            response = await take(limit)
            if response:
                return response
            remaining = give_up_at - loop.time()
            if remaining <= 0 or self._stopping:
                return b""
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    async def _pull(
        self, request: feed_pb2.PullRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        queue = await self._admit_unary(context)

        async def take(limit: int) -> bytes:
            batch = queue.take(limit, queue.pull_holder, time.time()) if queue.ready else []
            if not batch:
                return b""
            self._note_deliveries(batch)
            if self.persistence.durable:
                # The delivery counts are on disk before the receipts leave (F6 after kill -9).
                await self.persistence.commit()
            return pull_response_bytes(
                delivery_bytes(e.base, e.token_bytes, e.delivery_count) for e in batch
            )

        return await self._long_poll(request, queue, take)

    async def _ack(
        self, request: feed_pb2.AckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> feed_pb2.AckResponse:
        queue = await self._admit_unary(context)
        faults = self.faults
        tokens = request.tokens
        await _check_ack_size(tokens, context)
        acked = self._apply_acks(queue, tokens)
        gone = [token for token, ok in zip(tokens, acked, strict=True) if not ok]
        if self.persistence.durable and len(gone) < len(tokens):
            await self.persistence.commit()
        if faults.chance(faults.ack_lost_rate):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fault: ack reply lost")
        return feed_pb2.AckResponse(acked=len(tokens) - len(gone), already_gone=gone)

    def _apply_acks(self, queue: LoginQueue, tokens: Sequence[str]) -> list[bool]:
        """F9: remove each token's receipt; False (already_gone) for gone, foreign, forged."""
        # Tokens are HMAC-signed and deterministic, (key, login, seq) -> token, so the live
        # tokens of a login can be rebuilt from the store after a restart; acking is then one
        # dict lookup per token, and a foreign, forged or spent token is simply not found.
        login = queue.login
        now = time.time()
        durable = self.persistence.durable
        remove = queue.remove_by_token
        outcome: list[bool] = []
        for token in tokens:
            entry = remove(token)
            if entry is None:
                outcome.append(False)
                if self._signer.verify(login, token) is None:
                    queue.counters.invalid_tokens += 1
                continue
            outcome.append(True)
            self._record(login, "ack", entry.seq, entry.token, now, entry.fields)
            if durable:
                self.persistence.pending.receipts_delete.append((entry.seq,))
        acked = sum(outcome)
        queue.counters.acked += acked
        queue.counters.already_gone += len(tokens) - acked
        if acked:
            queue.notify()  # F11: acks on any channel reopen paused windows.
        return outcome

    # -- the feed with --shared-store (SQLite is the authority, fakegw.shared) -------------
    def _with_duplicates(self, all_fields: list[ReceiptFields]) -> list[ReceiptFields]:
        """Apply the duplicate fault as `_enqueue_with_faults` does, one draw per receipt."""
        expanded: list[ReceiptFields] = []
        for fields in all_fields:
            expanded.append(fields)
            if self.faults.chance(self.faults.duplicate_rate):
                expanded.append(dict(fields))
        return expanded

    async def _enqueue_shared(
        self, queue: LoginQueue, all_fields: list[ReceiptFields]
    ) -> dict[str, int]:
        assert self._shared is not None
        enqueued, dropped = await self._shared.run(
            self._shared.enqueue, queue.login, all_fields, self.cap, time.time()
        )
        queue.counters.enqueued += enqueued
        queue.counters.dropped_at_cap += dropped
        queue.notify()
        return {"enqueued": enqueued, "dropped_at_cap": dropped}

    async def _sweep_shared(self, shared: SharedStore, now: float, cutoff: float) -> None:
        expired = await shared.run(shared.expire, now)
        removed = await shared.run(shared.expire_retention, cutoff)
        for login, count in expired.items():
            if login in self.queues:
                self.queues[login].counters.lease_expired += count
                self.queues[login].notify()
        for login, count in removed.items():
            if login in self.queues:
                self.queues[login].counters.removed_by_retention += count
        self._expire_deadlines(now)
        deadline_fields, self._shared_deadline_fields = self._shared_deadline_fields, {}
        for login, fields_list in deadline_fields.items():
            queue = self.queues[login]
            counts = await self._enqueue_shared(queue, fields_list)
            queue.counters.deadline_unknown += counts["enqueued"]
        self.persistence.mark_dirty()

    async def _watch_shared(self, shared: SharedStore) -> None:
        """Wake this node's waiting readers when another connection committed (F11, F10)."""
        while True:
            await asyncio.sleep(self.shared_poll_seconds)
            if shared.changed_elsewhere():
                for queue in self.queues.values():
                    queue.notify()

    def _release_shared(self, queue: LoginQueue, owner: str) -> None:
        """F7: queue the release of `owner`'s leases on the store thread, without awaiting.

        Not awaited, so a cancelled stream cannot skip it; the store thread runs it in order.
        """
        assert self._shared is not None
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._shared.executor, self._shared.release, owner)

        def released(done: asyncio.Future[dict[str, int]]) -> None:
            if not done.cancelled() and done.exception() is None:
                count = done.result().get(queue.login, 0)
                queue.counters.released_on_stream_end += count
                if count:
                    queue.notify()

        future.add_done_callback(released)

    async def _subscribe_shared(
        self, request: feed_pb2.SubscribeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        queue = await self.authenticate(context)
        shared = self._shared
        assert shared is not None
        faults = self.faults
        if faults.no_subscribe:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Subscribe is switched off")
        window = request.window
        if window == 0 or window > self.max_window:
            window = self.max_window
        self._stream_numbers += 1
        owner = f"{shared.node}:s{self._stream_numbers}"
        queue.streams += 1
        sent = 0
        try:
            if faults.latency_ms:
                await asyncio.sleep(faults.latency_ms / 1000)
            while not self._stopping:
                changed = queue.changed_event()
                # F11: the window counts this stream's leases in the store, so an ack at any
                # node (or a lease running out) reopens it.
                batch = await shared.run(
                    shared.lease,
                    queue.login,
                    owner,
                    _STREAM_STEP,
                    window,
                    time.time() + self.lease_seconds,
                )
                if batch:
                    self._count_shared_deliveries(queue, batch)
                    for _, count, wire, token, _ in batch:
                        yield delivery_bytes(wire, token_field(token), count)
                        sent += 1
                        if faults.cut_stream_every and sent % faults.cut_stream_every == 0:
                            await context.abort(grpc.StatusCode.UNAVAILABLE, "fault: stream cut")
                    continue
                await changed.wait()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "gateway shutting down")
        finally:
            queue.streams -= 1
            # F7: a stream that ends releases its unacked receipts at once, for every node.
            self._release_shared(queue, owner)

    @staticmethod
    def _count_shared_deliveries(
        queue: LoginQueue, batch: Sequence[tuple[int, int, bytes, str, int]]
    ) -> None:
        counters = queue.counters
        counters.delivered += len(batch)
        counters.redelivered += sum(1 for row in batch if row[1] > 1)

    async def _pull_shared(
        self, request: feed_pb2.PullRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        queue = await self._admit_unary(context)
        shared = self._shared
        assert shared is not None
        owner = f"{shared.node}:pull"

        async def take(limit: int) -> bytes:
            # F12: the lease is one atomic UPDATE in the store; delivery counts are committed
            # before the receipts leave (F6 after kill -9). Another node's inject wakes the
            # long poll through _watch_shared.
            batch = await shared.run(
                shared.lease, queue.login, owner, limit, None, time.time() + self.lease_seconds
            )
            if not batch:
                return b""
            self._count_shared_deliveries(queue, batch)
            return pull_response_bytes(
                delivery_bytes(wire, token_field(token), count)
                for _, count, wire, token, _ in batch
            )

        return await self._long_poll(request, queue, take)

    async def _ack_shared(
        self, request: feed_pb2.AckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> feed_pb2.AckResponse:
        queue = await self._admit_unary(context)
        shared = self._shared
        assert shared is not None
        faults = self.faults
        tokens = list(request.tokens)
        await _check_ack_size(tokens, context)
        # F9: one DELETE ... RETURNING; a token of a receipt acked at any node, of another
        # login, malformed or forged names no row and is already_gone.
        outcome, invalid = await shared.run(shared.ack, queue.login, tokens, time.time())
        gone = [token for token, ok in zip(tokens, outcome, strict=True) if not ok]
        counters = queue.counters
        counters.acked += len(tokens) - len(gone)
        counters.already_gone += len(gone)
        counters.invalid_tokens += invalid
        if len(gone) < len(tokens):
            queue.notify()
        if faults.chance(faults.ack_lost_rate):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fault: ack reply lost")
        return feed_pb2.AckResponse(acked=len(tokens) - len(gone), already_gone=gone)

    # -- admin ----------------------------------------------------------------------------
    def _admin_handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        from fakegw.admin import admin_handlers

        return grpc.method_handlers_generic_handler(ADMIN_SERVICE, admin_handlers(self))


async def _check_ack_size(
    tokens: Sequence[str], context: grpc.aio.ServicerContext[Any, Any]
) -> None:
    """Spec "decided here": none or more than 1000 tokens is INVALID_ARGUMENT (F9)."""
    if not 1 <= len(tokens) <= MAX_ACK_TOKENS:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"an Ack carries 1 to {MAX_ACK_TOKENS} tokens, got {len(tokens)}",
        )


def _ledger_record(
    ledger_id: int, kind: str, login: str, seq: int, token: str, at: float, receipt: Any
) -> dict[str, Any]:
    """One ledger record as `FakeGateway.ledger` returns it, from memory or the shared store."""
    return {
        "id": ledger_id,
        "kind": kind,
        "login": login,
        "seq": seq,
        "token": token,
        "at": at,
        "receipt": receipt,
    }

"""The fake gateway: a grpc.aio server speaking `gateway.receipts.v1.ReceiptFeed` (F1-F16).

`FakeGateway` is both the daemon behind `fakegw serve` and an in-process test fixture:

    async with FakeGateway({"acme": "secret"}, lease_seconds=2).running() as gw:
        await gw.inject("acme", [{"id": "m1", "level": 2, "stat": "DELIVRD"}])
        ... connect a client to gw.target ...
        assert gw.stats("acme")["acked"] == 1

Subscribe, Pull and Ack are written once, here, over a `FeedBackend` (fakegw.backend): the
queues live in this process (fakegw.memory_backend) or, with `shared_store=True`, in a SQLite
file several processes serve as one gateway (fakegw.shared_backend). What every backend shares
stays here: credentials (FD1), faults, the window and Pull limits, the duplicate fault, F2/F3,
and the callbacks a receipt with a `dlr_url` gets instead of the feed (fakegw.callback_sender).

The same port also serves the admin service `fakegw.admin.v1.Admin` (JSON bodies, see
fakegw.admin), used by `fakegw inject|send|stats` and by tests in other processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import grpc

from fakegw.activity import LoginActivity
from fakegw.admin import admin_handler
from fakegw.auth import BasicCredentials
from fakegw.backend import EnqueueResult, FeedBackend
from fakegw.callback_sender import CallbackSender
from fakegw.callbacks import CallbackSettings, checked_dlr_url
from fakegw.faults import Faults
from fakegw.memory_backend import MemoryBackend
from fakegw.persistence import Journal, LoadedState, NullPersistence, SqlitePersistence
from fakegw.sent_messages import SentMessages
from fakegw.shared_backend import SharedBackend
from fakegw.tokens import TokenSigner
from fakegw.wire import ReceiptFields, normalize_fields, pull_response_bytes
from gateway.receipts.v1 import feed_pb2

FEED_SERVICE = "gateway.receipts.v1.ReceiptFeed"
MAX_PULL = 1000  # F10
MAX_PULL_WAIT_SECONDS = 20  # F10
MAX_ACK_TOKENS = 1000  # F9
# A stream leases at most this many receipts per step, so acks and other readers interleave.
_STREAM_STEP = 64

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The gateway's default gRPC message limit; dlrfeed's receive limit is at least this on
purpose: whatever the gateway can send, the daemon accepts (docs/security.md)."""

Context = grpc.aio.ServicerContext[Any, Any]


def _identity(payload: bytes) -> bytes:
    return payload


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
        callbacks: CallbackSettings | None = None,
    ) -> None:
        if not logins:
            raise ValueError("at least one login is needed")
        if shared_store and store == ":memory:":
            raise ValueError("shared_store needs a store file")
        self.store = store
        # --shared-store: SQLite, not this process, owns queues, leases and acks (fakegw.shared).
        self.shared_store = shared_store
        self.shared_poll_seconds = shared_poll_seconds
        self.lease_seconds = lease_seconds
        self.max_window = max_window
        self.cap = cap
        self.retention_seconds = retention_seconds
        self.dlr_deadline_seconds = dlr_deadline_seconds
        self.max_pull_wait_seconds = max_pull_wait_seconds
        self.ledger_max_records = ledger_max_records
        self._faults = faults if faults is not None else Faults()
        # TLS (and mTLS when the credentials require client certificates); None = plaintext.
        self.server_credentials = server_credentials
        # gRPC send/receive limit of every message (docs/security.md): a receipt larger than
        # this cannot be sent; the call fails RESOURCE_EXHAUSTED.
        self.max_message_bytes = max_message_bytes
        # Leases, retention and deadlines are checked this often; short leases get short ticks.
        self.housekeeping_seconds = housekeeping_seconds or min(0.5, max(0.02, lease_seconds / 20))
        self._credentials = BasicCredentials(logins)
        self._activities = {login: LoginActivity(login) for login in logins}
        self._journal: Journal = (
            NullPersistence() if store == ":memory:" else SqlitePersistence(store)
        )
        self._sent = SentMessages(self._journal, dlr_deadline_seconds)
        # F2: receipts of a message with a `dlr_url` are POSTed there, never queued.
        self._callbacks = CallbackSender(
            callbacks if callbacks is not None else CallbackSettings(),
            self._journal,
            self._faults,
            self._activities,
            self._ledger_callbacks,
        )
        self._backend: FeedBackend | None = None
        self._server: grpc.aio.Server | None = None
        self._housekeeper: asyncio.Task[None] | None = None
        self._stopping = False
        self._started = False
        self.port = 0
        self.host = "127.0.0.1"

    def _ledger_callbacks(
        self, kind: str, login: str, callbacks: Sequence[tuple[str, ReceiptFields]], now: float
    ) -> None:
        """The callbacks' ledger records go where the queue's do (the backend's ledger)."""
        if self._backend is not None:
            self._backend.record_callbacks(kind, login, callbacks, now)

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def target(self) -> str:
        """`host:port` a client dials."""
        return f"{self.host}:{self.port}"

    @property
    def faults(self) -> Faults:
        """The fault knobs; change them in place (`gw.faults.update({...})`)."""
        return self._faults

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Load the store, bind `host:port` (0 = any free port) and serve; returns the port.

        An instance serves once: to restart on the same store, create a new FakeGateway.
        """
        if self._started:
            raise RuntimeError("a FakeGateway starts once; create a new one to restart")
        self._started = True
        state = self._journal.load()
        self._sent.restore(state.sent)
        self._callbacks.restore(state.callbacks)
        backend = self._open_backend(state)
        await backend.start()
        await self._journal.start()
        await self._callbacks.start()
        self._backend = backend
        server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
            ]
        )
        server.add_generic_rpc_handlers((self._feed_handler(), admin_handler(self)))
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
        return bound

    def _open_backend(self, state: LoadedState) -> FeedBackend:
        # F9: the token key comes from the store, so every process on it accepts the tokens.
        signer = TokenSigner(state.hmac_key)
        if self.shared_store:
            # The store file, not the journal read back here, holds queues and ledger.
            return SharedBackend(
                self.store,
                signer,
                lease_seconds=self.lease_seconds,
                cap=self.cap,
                poll_seconds=self.shared_poll_seconds,
                on_change_elsewhere=self._wake_all,
            )
        return MemoryBackend(
            list(self._activities),
            self._journal,
            state,
            signer,
            lease_seconds=self.lease_seconds,
            cap=self.cap,
            ledger_max_records=self.ledger_max_records,
        )

    async def stop(self, grace: float | None = 0.2) -> None:
        """Stop serving: open streams end (F7 releases their receipts), the store is flushed."""
        self._stopping = True
        self._wake_all()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self._housekeeper is not None:
            self._housekeeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeper
            self._housekeeper = None
        # Callbacks in flight are abandoned; the journal keeps them pending for the next start.
        await self._callbacks.close()
        if self._backend is not None:
            # After the streams' releases (F7), which the backend has queued or done.
            await self._backend.close()
        await self._journal.close()

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

    @property
    def _started_backend(self) -> FeedBackend:
        if self._backend is None:
            raise RuntimeError("the FakeGateway has not started")
        return self._backend

    def _wake_all(self) -> None:
        for activity in self._activities.values():
            activity.notify()

    # -- authentication -------------------------------------------------------------------
    def has_login(self, login: str) -> bool:
        """Whether `login` is one of the configured logins."""
        return login in self._activities

    async def authenticate(self, context: Context) -> str:
        """FD1: the login proved by Basic credentials in metadata, else UNAUTHENTICATED."""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                login = self._credentials.login_for(value)
                if login is not None:
                    return login
                break
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong credentials")
        raise AssertionError("abort returns by raising")

    # -- enqueue --------------------------------------------------------------------------
    async def _enqueue(self, login: str, receipts: Sequence[ReceiptFields]) -> EnqueueResult:
        """Enqueue with the duplicate fault (F8 says clients must dedupe), one draw each."""
        faults = self._faults
        expanded: list[ReceiptFields] = []
        for fields in receipts:
            expanded.append(fields)
            if faults.chance(faults.duplicate_rate):
                expanded.append(dict(fields))  # the same id + level, enqueued again
        result = await self._started_backend.enqueue(login, expanded, time.time())
        self._activities[login].enqueued(*result)
        return result

    async def inject(self, login: str, bodies: Iterable[Mapping[str, object]]) -> dict[str, int]:
        """Enqueue receipts (webhook-body dicts, keys = Receipt fields 1-13) for `login`.

        A body that also carries `dlr_url` is not queued: it is POSTed to that URL (F2: the
        webhook wins), without the `dlr_url` key. Returns `{"enqueued": n, "dropped_at_cap": m,
        "callbacks": c}` once all of them are durable. Duplicate faults apply to the queue. All
        bodies are validated first, so a malformed one enqueues nothing (ValueError).
        """
        queued: list[ReceiptFields] = []
        callbacks: list[tuple[str, ReceiptFields]] = []
        for body in bodies:
            url = body.get("dlr_url")
            if url is None or url == "":
                queued.append(normalize_fields(body))
            else:
                fields = normalize_fields({k: v for k, v in body.items() if k != "dlr_url"})
                callbacks.append((checked_dlr_url(url), fields))
        enqueued, dropped = await self._enqueue(login, queued)
        if callbacks:
            self._callbacks.submit(login, callbacks, time.time())
            await self._journal.commit()
        return {"enqueued": enqueued, "dropped_at_cap": dropped, "callbacks": len(callbacks)}

    async def send(self, login: str, messages: Iterable[Mapping[str, Any]]) -> dict[str, int]:
        """Register sent messages (F2 inputs; F3 deadline starts at `sent_at`)."""
        registered = self._sent.register(login, messages, time.time())
        await self._journal.commit()
        return {"registered": registered}

    async def report(self, login: str, bodies: Iterable[Mapping[str, object]]) -> dict[str, int]:
        """The network reports receipts for sent messages; F2 decides which reach the feed,
        and which the message's `dlr_url` instead.

        Returns counts: `enqueued`, `callbacks` (to be POSTed to the `dlr_url`), `filtered` (F2
        said no), `unknown_message` (never sent by this login; use `inject` to enqueue receipts
        for unknown ids), `dropped_at_cap`.
        """
        counters = self._activities[login].counters
        all_fields = [normalize_fields(body) for body in bodies]
        result = {
            "enqueued": 0,
            "callbacks": 0,
            "filtered": 0,
            "unknown_message": 0,
            "dropped_at_cap": 0,
        }
        wanted: list[ReceiptFields] = []
        callbacks: list[tuple[str, ReceiptFields]] = []
        for fields in all_fields:
            message = self._sent.find(login, str(fields.get("id", "")))
            if message is None:
                result["unknown_message"] += 1
                continue
            level = int(fields.get("level", 0))
            if level == 2:
                self._sent.resolve(message)
            url = message.callback_url(level)
            if url is not None:
                callbacks.append((url, fields))  # F2: the webhook wins
            elif message.feed_wants(level):
                wanted.append(fields)
            else:
                result["filtered"] += 1
                counters.filtered_by_f2 += 1
        if wanted:
            result["enqueued"], result["dropped_at_cap"] = await self._enqueue(login, wanted)
        if callbacks:
            result["callbacks"] = self._callbacks.submit(login, callbacks, time.time())
        await self._journal.commit()
        return result

    # -- inspection and housekeeping ------------------------------------------------------
    def stats(self, login: str) -> dict[str, int]:
        """docs/spec/interfaces.md §2 counters (`queued`, `in_flight`, `acked`, `redelivered`,
        `dropped_at_cap`) and more, for one login."""
        activity = self._activities[login]
        queued, in_flight = self._started_backend.sizes(login)
        return {
            "queued": queued,
            "in_flight": in_flight,
            "total": queued + in_flight,
            "callbacks_pending": self._callbacks.pending(login),
            **activity.counter_values(),
            "streams": activity.streams,
        }

    def ledger(
        self, login: str | None = None, after: int = 0, limit: int = 10_000
    ) -> dict[str, Any]:
        """Ledger records with id > `after` (of `login`, or all), at most `limit`.

        Each record: `id`, `kind` ("enqueue" or "ack"), `login`, `seq`, `token`, `at` (epoch
        seconds), `receipt` (fields 1-13). `next` is the `after` for the following page.
        `first_id` is the oldest id still held (above 1 only with `ledger_max_records`).
        """
        page = self._started_backend.ledger(login, after, limit)
        return {
            "records": [record.to_json() for record in page.records],
            "next": page.next_after,
            "first_id": page.first_id,
        }

    async def sweep(self) -> None:
        """Run lease expiry (F6), retention (F16) and the receipt deadline (F3) now."""
        backend = self._started_backend
        now = time.time()
        swept = await backend.sweep(now, now - self.retention_seconds)
        for login, counts in swept.items():
            if login in self._activities:
                self._activities[login].swept(counts.lease_expired, counts.removed_by_retention)
        due = self._sent.due_receipts(now)
        for login, receipts in due.feed.items():
            activity = self._activities.get(login)
            if activity is None:
                continue  # a login no longer configured: resolved, nothing to enqueue
            # F3: one last receipt, UNKNOWN, as a webhook would get it (no duplicate fault).
            result = await backend.enqueue(login, receipts, now)
            activity.enqueued(*result)
            activity.counters.deadline_unknown += result.enqueued
        for login, callbacks in due.callbacks.items():
            if login in self._activities:
                # F3 and F2: the message's webhook gets its UNKNOWN; journaled in the same
                # batch as the message's resolution, so a crash loses both or neither.
                self._callbacks.submit(login, callbacks, now)
        self._journal.mark_dirty()

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(self.housekeeping_seconds)
            await self.sweep()

    # -- the feed -------------------------------------------------------------------------
    def _feed_handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        handlers = {
            "Subscribe": grpc.unary_stream_rpc_method_handler(
                self._subscribe,
                request_deserializer=feed_pb2.SubscribeRequest.FromString,
                response_serializer=_identity,
            ),
            "Pull": grpc.unary_unary_rpc_method_handler(
                self._pull,
                request_deserializer=feed_pb2.PullRequest.FromString,
                response_serializer=_identity,
            ),
            "Ack": grpc.unary_unary_rpc_method_handler(
                self._ack,
                request_deserializer=feed_pb2.AckRequest.FromString,
                response_serializer=feed_pb2.AckResponse.SerializeToString,
            ),
        }
        return grpc.method_handlers_generic_handler(FEED_SERVICE, handlers)

    async def _subscribe(
        self, request: feed_pb2.SubscribeRequest, context: Context
    ) -> AsyncIterator[bytes]:
        login = await self.authenticate(context)
        activity = self._activities[login]
        faults = self._faults
        if faults.no_subscribe:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Subscribe is switched off")
        # F11: unset or above the maximum means the maximum.
        window = request.window
        if window == 0 or window > self.max_window:
            window = self.max_window
        reader = self._started_backend.reader(login, pull=False)
        activity.streams += 1
        sent = 0
        try:
            if faults.latency_ms:
                await asyncio.sleep(faults.latency_ms / 1000)
            while not self._stopping:
                changed = activity.changed_event()
                deliveries = await reader.take(_STREAM_STEP, window, time.time())
                if deliveries.receipts:
                    activity.delivered(len(deliveries.receipts), deliveries.redelivered)
                    for receipt in deliveries.receipts:
                        yield receipt
                        sent += 1
                        if faults.cut_stream_every and sent % faults.cut_stream_every == 0:
                            await context.abort(grpc.StatusCode.UNAVAILABLE, "fault: stream cut")
                    continue
                # F11: at the window the stream pauses until acks arrive, on any channel.
                await changed.wait()
            # A gateway going down ends its streams with an error, as a restart would.
            await context.abort(grpc.StatusCode.UNAVAILABLE, "gateway shutting down")
        finally:
            activity.streams -= 1
            # F7: a stream that ends releases its unacked receipts at once.
            reader.release(activity.released)

    async def _admit_unary(self, context: Context) -> str:
        """Authenticate a Pull or Ack, then apply the call faults (latency, UNAVAILABLE)."""
        login = await self.authenticate(context)
        faults = self._faults
        if faults.latency_ms:
            await asyncio.sleep(faults.latency_ms / 1000)
        if faults.chance(faults.unavailable_rate):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fault: unavailable")
        return login

    async def _pull(self, request: feed_pb2.PullRequest, context: Context) -> bytes:
        """F10: up to `max` receipts now, or as soon as one arrives within `wait_seconds`.

        At most 1000 (unset means 1000) and at most 20 s; larger values are clamped. Returns an
        empty response when the wait runs out.
        """
        login = await self._admit_unary(context)
        activity = self._activities[login]
        reader = self._started_backend.reader(login, pull=True)
        limit = min(request.max or MAX_PULL, MAX_PULL)
        wait = min(float(request.wait_seconds), self.max_pull_wait_seconds)
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + wait
        while True:
            changed = activity.changed_event()
            deliveries = await reader.take(limit, None, time.time())
            if deliveries.receipts:
                activity.delivered(len(deliveries.receipts), deliveries.redelivered)
                return pull_response_bytes(deliveries.receipts)
            remaining = give_up_at - loop.time()
            if remaining <= 0 or self._stopping:
                return b""
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    async def _ack(self, request: feed_pb2.AckRequest, context: Context) -> feed_pb2.AckResponse:
        login = await self._admit_unary(context)
        tokens = request.tokens
        if not 1 <= len(tokens) <= MAX_ACK_TOKENS:
            # FD3: none or more than 1000 tokens (F9).
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"an Ack carries 1 to {MAX_ACK_TOKENS} tokens, got {len(tokens)}",
            )
        result = await self._started_backend.ack(login, tokens, time.time())
        gone = [token for token, ok in zip(tokens, result.acked, strict=True) if not ok]
        acked = len(tokens) - len(gone)
        self._activities[login].acks(acked, len(gone), result.invalid_tokens)
        if self._faults.chance(self._faults.ack_lost_rate):
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fault: ack reply lost")
        return feed_pb2.AckResponse(acked=acked, already_gone=gone)

"""The growth benchmark's traffic: gateway-shaped receipts (random ids, a message's result in a
later batch than its progress, ~5 % redeliveries) and the sending side's records, with a share
of them recorded late, deterministic for a seed."""

from __future__ import annotations

import random
import time
import uuid

from dlrfeed.domain.receipt import AckToken, MessageId, Receipt
from dlrfeed.store import Store, Submission
from dlrfeed_tools.local_login import LOGIN
from gateway.receipts.v1 import feed_pb2

MESSAGES_PER_BATCH = 250  # each batch: their progress + the previous batch's results + repeats
BATCHES_PER_ROUND = 20  # one record_submissions of 5,000 ids ahead of 20 batches
LATE_SHARE = 0.02  # of a round's messages, recorded only in the next round (late correlation)
REDELIVERED_SHARE = 0.05


class Traffic:
    """Gateway-shaped receipts and the sending side's records, deterministic for a seed."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._pending_results: list[Receipt] = []
        self._last_batch: list[Receipt] = []
        self._upcoming: list[str] = []
        self._held_back: list[str] = []

    def new_id(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def submissions(self) -> list[Submission]:
        """The next round's sent messages (5,000 ids): most of them ahead of their receipts,
        the ids held back from the round before now recorded after theirs (late)."""
        fresh = [self.new_id() for _ in range(MESSAGES_PER_BATCH * BATCHES_PER_ROUND)]
        self._upcoming = fresh
        held = set(self._rng.sample(fresh, int(len(fresh) * LATE_SHARE)))
        recorded = [m for m in fresh if m not in held] + self._held_back
        self._held_back = sorted(held)
        return [Submission(LOGIN, m, "+34600123456", submitted_at=None) for m in recorded]

    def batch(self, index: int) -> list[Receipt]:
        """Progress of this batch's messages, results of the previous batch's, ~5 % repeats."""
        now = time.time()
        ids = self._upcoming[index * MESSAGES_PER_BATCH : (index + 1) * MESSAGES_PER_BATCH]
        receipts = [self.receipt(m, 1, "ENROUTE", now) for m in ids]
        receipts += self._pending_results
        self._pending_results = [self.receipt(m, 2, "DELIVRD", now) for m in ids]
        repeats = self._rng.sample(self._last_batch, int(len(self._last_batch) * REDELIVERED_SHARE))
        receipts += [r._replace(delivery_count=2, received_at=now) for r in repeats]
        self._rng.shuffle(receipts)
        self._last_batch = receipts
        return receipts

    def receipt(self, message_id: str, level: int, stat: str, now: float) -> Receipt:
        """One receipt of `message_id` as the gateway sends it: its wire bytes are `raw`."""
        wire = feed_pb2.Receipt(
            id=message_id,
            level=level,
            stat=stat,
            err="000",
            sub="001",
            dlvrd="001",
            submit_date="2612011200",
            done_date="2612011201",
            text="Your verification code is 123456",
            source_addr="ACME",
            destination_addr="34600123456",
            smsc_message_id=f"{self._rng.getrandbits(64):016x}",
            connector="smsc-eu-1",
            ack_token=f"{message_id}.{level}.{self._rng.getrandbits(32):08x}",
            delivery_count=1,
        )
        return Receipt(
            message_id=MessageId(message_id),
            level=level,
            stat=stat,
            err=wire.err,
            sub=wire.sub,
            dlvrd=wire.dlvrd,
            submit_date=wire.submit_date,
            done_date=wire.done_date,
            text=wire.text,
            source_addr=wire.source_addr,
            destination_addr=wire.destination_addr,
            smsc_message_id=wire.smsc_message_id,
            connector=wire.connector,
            delivery_count=1,
            ack_token=AckToken(wire.ack_token),
            raw=wire.SerializeToString(),
            received_at=now,
        )


async def ingest_rounds(store: Store, traffic: Traffic, receptions: int) -> int:
    """Feed `store` whole rounds of `traffic` (the round's messages recorded, then its batches
    ingested) until at least `receptions` are stored; returns how many were."""
    stored = 0
    while stored < receptions:
        await store.record_submissions(traffic.submissions())
        for index in range(BATCHES_PER_ROUND):
            batch = traffic.batch(index)
            await store.ingest(LOGIN, batch)
            stored += len(batch)
    return stored

"""The growth benchmark's traffic has the shape it claims (scripts/bench_growth.py)."""

from __future__ import annotations

import itertools
import uuid
from collections import Counter

from dlrfeed_testing.bench.growth import BATCHES_PER_ROUND, LATE_SHARE, MESSAGES_PER_BATCH, Traffic


def test_traffic_is_gateway_shaped() -> None:
    traffic = Traffic(seed=3)
    first_round = traffic.submissions()
    batches = [traffic.batch(i) for i in range(BATCHES_PER_ROUND)]
    second_round = {s.message_id for s in traffic.submissions()}
    fresh = MESSAGES_PER_BATCH * BATCHES_PER_ROUND
    # Random UUID-like ids, recorded ahead of their receipts; 2 % held back to the next round.
    assert all(uuid.UUID(s.message_id).version == 4 for s in first_round)
    assert len(first_round) == fresh - int(fresh * LATE_SHARE)
    first_ids = {s.message_id for s in first_round}
    progressed = {r.message_id for b in batches for r in b if r.level == 1}
    held_back = progressed - first_ids
    assert len(held_back) == int(fresh * LATE_SHARE)
    assert held_back <= second_round  # recorded late, in the next round's call
    # A message's result comes one batch after its progress, never in the same batch.
    for earlier, later in itertools.pairwise(batches):
        progress = {r.message_id for r in earlier if r.level == 1 and r.delivery_count == 1}
        results = {r.message_id for r in later if r.level == 2 and r.delivery_count == 1}
        assert results == progress
        assert not {r.message_id for r in earlier if r.level == 2} & progress
    # ~5 % of each batch repeats a receipt of the batch before, as a redelivery.
    repeats = Counter(r.delivery_count for b in batches[1:] for r in b)
    share = repeats[2] / sum(repeats.values())
    assert 0.04 < share < 0.06

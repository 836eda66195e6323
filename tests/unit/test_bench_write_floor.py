"""The write floor benchmark's receipts are production-shaped: random UUID message ids, a
message's result in the batch after its progress, ~5 % redeliveries, batches of 500."""

from __future__ import annotations

import uuid
from collections import Counter

from dlrfeed_tools.bench.write_floor import workload


def test_workload_is_production_shaped_and_deterministic() -> None:
    work = workload(5_000, batch_size=500, seed=7)
    assert work.receipts == 5_000
    assert [len(batch) for batch in work.batches[1:-1]] == [500] * (len(work.batches) - 2)
    assert all(uuid.UUID(m).version == 4 for m in work.message_ids)
    assert len(set(work.message_ids)) == len(work.message_ids)
    first_seen: dict[tuple[str, int], int] = {}
    last_seen: dict[tuple[str, int], int] = {}
    raw: dict[tuple[str, int], bytes] = {}
    copies: Counter[tuple[str, int]] = Counter()
    for number, batch in enumerate(work.batches):
        for receipt in batch:
            key = (receipt.message_id, receipt.level)
            copies[key] += 1
            if key in first_seen:  # a redelivery: the same bytes as in the batch before
                assert (receipt.delivery_count, receipt.raw) == (2, raw[key])
                assert last_seen[key] == number - 1
            else:
                first_seen[key], raw[key] = number, receipt.raw
            last_seen[key] = number
    for message_id in work.message_ids:
        assert first_seen[(message_id, 2)] == first_seen[(message_id, 1)] + 1
    redelivered = sum(copies.values()) - len(copies)
    assert 0.04 * work.receipts < redelivered < 0.06 * work.receipts
    assert workload(5_000, batch_size=500, seed=7).message_ids == work.message_ids

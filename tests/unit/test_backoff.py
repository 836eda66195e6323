"""The one retry delay: exponential, jittered, capped (reconnect storms are the failure to
avoid)."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from dlrfeed.backoff import Backoff


@given(attempt=st.integers(min_value=1, max_value=200), seed=st.integers(0, 2**32))
def test_delay_is_half_to_all_of_the_capped_step(attempt: int, seed: int) -> None:
    step = min(10.0, 0.2 * 2 ** (attempt - 1))
    assert step / 2 <= Backoff(0.2, 10.0, rng=random.Random(seed)).delay(attempt) <= step


def test_delays_grow_then_stop_at_the_cap_and_are_jittered() -> None:
    backoff = Backoff(0.2, 10.0, rng=random.Random(3))
    assert backoff.delay(1) <= 0.2
    assert backoff.delay(6) >= 3.2
    assert max(backoff.delay(50) for _ in range(100)) <= 10.0
    assert len({backoff.delay(8) for _ in range(20)}) > 1


def test_the_same_seed_gives_the_same_delays() -> None:
    def delays(seed: int) -> list[float]:
        backoff = Backoff(0.05, 5.0, rng=random.Random(seed))
        return [backoff.delay(attempt) for attempt in range(1, 10)]

    assert delays(11) == delays(11)
    assert delays(11) != delays(12)

"""The retry delay: exponential, jittered, capped (reconnect storms are the failure to avoid)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dlrfeed.backoff import backoff_delay


@given(attempt=st.integers(min_value=1, max_value=200))
def test_delay_is_half_to_all_of_the_capped_step(attempt: int) -> None:
    step = min(10.0, 0.2 * 2 ** (attempt - 1))
    assert step / 2 <= backoff_delay(attempt, 0.2, 10.0) <= step


def test_delays_grow_then_stop_at_the_cap_and_are_jittered() -> None:
    assert backoff_delay(1, 0.2, 10.0) <= 0.2
    assert backoff_delay(6, 0.2, 10.0) >= 3.2
    assert max(backoff_delay(50, 0.2, 10.0) for _ in range(100)) <= 10.0
    assert len({backoff_delay(8, 0.2, 10.0) for _ in range(20)}) > 1

"""Auto mode's decisions (docs/daemon.md, "Modes"), asked of the pure `AutoPolicy`: it is told
what happened and when, and asked which RPC to use. No clock, no gRPC, no database."""

from __future__ import annotations

from dlrfeed.feed.modes import (
    AUTO_MIN_PULL_SECONDS,
    AutoPolicy,
    AutoSettings,
    FixedMode,
    Mode,
    Switch,
)
from dlrfeed.feed.reader import ReaderSettings, mode_policy

BATCH = 500
START = 1_000.0


def fresh(*, rate: float = 2000.0, cooldown: float = 60.0, failures: int = 3) -> AutoPolicy:
    return AutoPolicy(
        AutoSettings(
            batch_size=BATCH, pull_max=BATCH, cooldown=cooldown, pull_rate=rate, failures=failures
        )
    )


def auto(*, rate: float = 2000.0, cooldown: float = 60.0, failures: int = 3) -> AutoPolicy:
    """A policy past its start: its first Pulls came back short, so it is on Subscribe."""
    policy = fresh(rate=rate, cooldown=cooldown, failures=failures)
    policy.opened(Mode.PULL, 0.0)
    for at in (0.1, 0.2, 0.3):
        policy.pulled(0, at)
    policy.closed()
    assert policy.mode(0.4) is Mode.SUBSCRIBE
    assert policy.take_switch() == Switch(Mode.SUBSCRIBE, "caught_up")
    return policy


def test_a_reader_starts_on_pull_and_drains_a_backlog_there_before_subscribing() -> None:
    """After a start the queue most likely holds a backlog: Pull drains it; full Pulls keep
    it, and three short ones in a row move to Subscribe."""
    policy = fresh()
    assert policy.mode(0.0) is Mode.PULL
    policy.opened(Mode.PULL, 0.0)
    for at in range(1, 50):
        policy.pulled(BATCH, float(at))
        assert policy.mode(float(at)) is Mode.PULL
    for short_at in (50.0, 51.0):
        policy.pulled(3, short_at)
        assert policy.mode(short_at) is Mode.PULL
    policy.pulled(0, 52.0)
    assert policy.mode(52.0) is Mode.SUBSCRIBE
    assert policy.take_switch() == Switch(Mode.SUBSCRIBE, "caught_up")


def stream(policy: AutoPolicy, arrivals: list[float]) -> float | None:
    """Open a Subscribe stream at START and deliver one receipt at each START + t; the time
    the policy first answers Pull, or None if it stays on Subscribe."""
    policy.opened(Mode.SUBSCRIBE, START)
    for at in arrivals:
        policy.streamed(1, START + at)
        if policy.mode(START + at) is Mode.PULL:
            return at
    return None


def test_a_fast_stream_moves_to_pull_within_half_a_second() -> None:
    """1,200 receipts in 0.5 s (2,400/s) against a threshold of 2,000/s: a backlog."""
    policy = auto()
    left_at = stream(policy, [i * 0.5 / 1_200 for i in range(1, 1_202)])
    assert left_at is not None
    assert left_at <= 0.51
    assert policy.take_switch() == Switch(Mode.PULL, "backlog")
    assert policy.take_switch() is None  # told once


def test_a_stream_below_the_rate_stays_on_subscribe() -> None:
    """1,800/s for 2 s: a heavy live flow below the threshold keeps Subscribe's latency."""
    policy = auto()
    assert stream(policy, [i / 1_800 for i in range(1, 3_600)]) is None
    assert policy.take_switch() is None


def test_a_burst_then_a_long_quiet_spell_is_not_a_backlog() -> None:
    """999 receipts in 0.1 s, then one a minute later: 1,000 over 60 s, not over half a second
    (the rate is taken over the span's real length)."""
    arrivals = [i * 0.1 / 999 for i in range(1, 1_000)] + [60.1]
    assert stream(auto(), arrivals) is None


def test_two_full_batches_in_a_row_are_a_backlog_at_the_next_receipt() -> None:
    policy = auto()
    policy.opened(Mode.SUBSCRIBE, START)
    policy.batch_closed(BATCH)
    policy.streamed(1, START + 0.01)
    assert policy.mode(START + 0.01) is Mode.SUBSCRIBE
    policy.batch_closed(BATCH)
    policy.streamed(1, START + 0.02)
    assert policy.mode(START + 0.02) is Mode.PULL


def test_a_partial_batch_breaks_the_streak_of_full_ones() -> None:
    policy = auto()
    policy.opened(Mode.SUBSCRIBE, START)
    for size in (BATCH, 17, BATCH):
        policy.batch_closed(size)
    policy.streamed(1, START + 0.01)
    assert policy.mode(START + 0.01) is Mode.SUBSCRIBE


def test_full_batches_before_a_stream_opened_say_nothing_about_it() -> None:
    """Batches of the Pulls that drained a backlog were full; the new stream starts afresh."""
    policy = auto()
    policy.batch_closed(BATCH)
    policy.batch_closed(BATCH)
    policy.opened(Mode.SUBSCRIBE, START)
    policy.streamed(1, START + 0.01)
    assert policy.mode(START + 0.01) is Mode.SUBSCRIBE


def drain_on_pull(policy: AutoPolicy, pulls: list[tuple[float, int]]) -> float | None:
    """Pulls returning `count` receipts at START + t; the time the policy answers Subscribe."""
    policy.opened(Mode.PULL, START + pulls[0][0])
    for at, count in pulls:
        policy.pulled(count, START + at)
        if policy.mode(START + at) is Mode.SUBSCRIBE:
            return at
    return None


def test_three_short_pulls_in_a_row_mean_caught_up() -> None:
    policy = auto()
    assert stream(policy, [i * 0.5 / 1_200 for i in range(1, 1_202)]) is not None
    policy.take_switch()
    policy.closed()
    late = AUTO_MIN_PULL_SECONDS + 1
    pulls = [(late, BATCH), (late + 1, 3), (late + 2, BATCH), (late + 3, 3), (late + 4, 0)]
    assert drain_on_pull(policy, [*pulls, (late + 5, 249)]) == late + 5
    assert policy.take_switch() == Switch(Mode.SUBSCRIBE, "caught_up")


def test_after_a_backlog_switch_pull_is_kept_for_a_while_even_when_caught_up() -> None:
    """No flapping: short Pulls within min(10 s, cooldown) of the switch keep Pull."""
    policy = auto()
    left_at = stream(policy, [i * 0.5 / 1_200 for i in range(1, 1_202)])
    assert left_at is not None
    policy.closed()
    short = [(left_at + 1 + i, 0) for i in range(5)]
    assert drain_on_pull(policy, short) is None
    until = left_at + AUTO_MIN_PULL_SECONDS
    assert drain_on_pull(policy, [(until, 0), (until + 0.1, 0), (until + 0.2, 0)]) == until + 0.2


def test_three_stream_failures_within_the_cooldown_block_subscribe_for_the_cooldown() -> None:
    policy = auto(cooldown=60.0)
    for at in (0.0, 10.0):
        policy.failed(Mode.SUBSCRIBE, START + at)
        assert policy.take_switch() is None
        assert policy.mode(START + at) is Mode.SUBSCRIBE
    policy.failed(Mode.SUBSCRIBE, START + 20.0)
    assert policy.take_switch() == Switch(Mode.PULL, "stream_failures", cooldown_s=60.0)
    assert policy.mode(START + 79.9) is Mode.PULL
    assert policy.mode(START + 80.0) is Mode.SUBSCRIBE


def test_failures_further_apart_than_the_cooldown_do_not_add_up() -> None:
    policy = auto(cooldown=60.0)
    for at in (0.0, 61.0, 122.0, 183.0):
        policy.failed(Mode.SUBSCRIBE, START + at)
        assert policy.mode(START + at) is Mode.SUBSCRIBE
    assert policy.take_switch() is None


def test_pull_failures_do_not_count_against_subscribe() -> None:
    policy = auto(failures=1)
    policy.failed(Mode.PULL, START)
    assert policy.mode(START) is Mode.SUBSCRIBE


def test_subscribe_unimplemented_means_pull_for_the_cooldown() -> None:
    policy = auto(cooldown=30.0)
    policy.unimplemented(START)
    assert policy.mode(START + 29.0) is Mode.PULL
    assert policy.mode(START + 30.0) is Mode.SUBSCRIBE


def test_a_pull_loop_while_subscribe_is_blocked_stays_until_caught_up_after_the_block() -> None:
    policy = auto(cooldown=30.0)
    policy.unimplemented(START)
    policy.opened(Mode.PULL, START)
    for i in range(3):
        policy.pulled(0, START + 1 + i)
    assert policy.mode(START + 3) is Mode.PULL  # caught up, but Subscribe is blocked
    policy.pulled(BATCH, START + 31)
    assert policy.mode(START + 31) is Mode.PULL  # the block is over, the Pulls are full
    for i in range(3):
        policy.pulled(0, START + 32 + i)
    assert policy.mode(START + 34) is Mode.SUBSCRIBE


def test_fixed_modes_ignore_everything() -> None:
    policy = FixedMode(Mode.SUBSCRIBE)
    for _ in range(5):
        policy.failed(Mode.SUBSCRIBE, START)
        policy.batch_closed(BATCH)
    policy.streamed(10_000, START + 0.5)
    assert policy.mode(START + 0.5) is Mode.SUBSCRIBE
    assert policy.take_switch() is None


def test_the_reader_settings_choose_the_policy() -> None:
    assert isinstance(mode_policy(ReaderSettings(mode=Mode.AUTO), BATCH), AutoPolicy)
    pull = mode_policy(ReaderSettings(mode=Mode.PULL), BATCH)
    assert pull.mode(START) is Mode.PULL

"""The state machine (P14-P19) as laws: hypothesis over permutations and duplications."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.parse import fingerprint
from dlrfeed.domain.rules import (
    TRANSITIONS,
    Delivery,
    EventFacts,
    Kind,
    MessageStatus,
    apply,
    kind_of,
    replay,
)
from dlrfeed.domain.status import STAT_TO_STATUS, Outcome, Status

DEFAULT = IntegrationOptions()
SUPERSEDING = IntegrationOptions(deadline_unknown_superseded=True)
PROGRESS_STATS = ["ACCEPTD", "ENROUTE"]
NETWORK_FINAL_STATS = ["DELIVRD", "UNDELIV", "EXPIRED", "DELETED", "REJECTD"]
DONE_DATES = [None, "2611291200", "2611291230", "ND"]


def facts(ref: int, stat: str, err: str | None = "000", done: str | None = None) -> EventFacts:
    done_at = None
    if done is not None and done.isdigit():
        done_at = datetime(2026, 11, 29, int(done[6:8]), int(done[8:10]), tzinfo=UTC)
    return EventFacts(
        ref=ref,
        status=STAT_TO_STATUS.get(stat, Status.UNRECOGNIZED),
        stat=stat,
        err=err,
        done_at=done_at,
        fingerprint=fingerprint(stat, err, done),
    )


# One logical event per level (levels 1-4: the store keys events by level, and levels other
# than 1/2 are kept and flagged, so they exercise more than two events per message).
contents = st.tuples(
    st.sampled_from([*PROGRESS_STATS, *NETWORK_FINAL_STATS, "UNKNOWN", "WEIRD"]),
    st.sampled_from([None, "000", "001"]),
    st.sampled_from(DONE_DATES),
)
message_events = st.dictionaries(st.integers(1, 4), contents, min_size=1, max_size=4)


def deliveries_of(events: dict[int, tuple[str, str | None, str | None]]) -> list[Delivery]:
    return [Delivery(level, facts(level, *content)) for level, content in events.items()]


@st.composite
def arrivals(
    draw: st.DrawFn, events: dict[int, tuple[str, str | None, str | None]]
) -> list[Delivery]:
    """Every event delivered 1-3 times (duplication), in any order (permutation)."""
    base = deliveries_of(events)
    copies = [d for d in base for _ in range(draw(st.integers(1, 3)))]
    return draw(st.permutations(copies))


def summary(status: MessageStatus | None) -> object:
    """The status with the supporting event's content (not its id, which ties may swap)."""
    if status is None:
        return None
    return status._replace(basis=status.basis._replace(ref=0))


def conflicting(events: dict[int, tuple[str, str | None, str | None]], supersede: bool) -> bool:
    finals = {STAT_TO_STATUS[c[0]] for c in events.values() if c[0] in STAT_TO_STATUS}
    finals -= {Status.ACCEPTED, Status.ENROUTE}
    if supersede and len(finals) == 2 and Status.UNKNOWN in finals:
        return False
    return len(finals) > 1


@given(data=st.data(), events=message_events, supersede=st.booleans())
def test_any_permutation_and_duplication_gives_same_status_and_counters_p16_p19(
    data: st.DataObject, events: dict[int, tuple[str, str | None, str | None]], supersede: bool
) -> None:
    """P16-P19/C1: the same deliveries (each event duplicated 1-3 times) in any two orders give
    the same status and counters, except with incompatible finals,
    where every order flags at least one conflict (docs/rules.md)."""
    options = SUPERSEDING if supersede else DEFAULT
    order = data.draw(arrivals(events))
    first, _ = replay(order, options)
    second, _ = replay(data.draw(st.permutations(order)), options)
    if conflicting(events, supersede):
        assert first is not None
        assert second is not None
        assert first.conflicts >= 1
        assert second.conflicts >= 1
        assert first.is_final
        assert second.is_final
    else:
        assert summary(first) == summary(second)
        if first is not None:
            assert first.conflicts == 0


@given(data=st.data(), events=message_events)
def test_repeats_change_only_repeat_counters_p14_c1(
    data: st.DataObject, events: dict[int, tuple[str, str | None, str | None]]
) -> None:
    """P14/C1: one more delivery of a stored event changes nothing but `repeats` (+1)."""
    order = data.draw(arrivals(events))
    before, _ = replay(order, DEFAULT)
    again = data.draw(st.sampled_from(order))
    # The content stored for a level is the first delivered; redeliver exactly that one.
    stored = next(d for d in order if d.level == again.level)
    after, outcomes = replay([*order, stored], DEFAULT)
    assert outcomes[-1] is Outcome.REPEAT
    if before is None:
        assert after is None
    else:
        assert after == before._replace(repeats=before.repeats + 1)


@given(
    events=message_events,
    progress=st.sampled_from(PROGRESS_STATS),
    done=st.sampled_from(DONE_DATES),
)
def test_progress_after_final_never_degrades_c2_f13(
    events: dict[int, tuple[str, str | None, str | None]], progress: str, done: str | None
) -> None:
    """C2/F13: a progress event after a final is recorded (late_progress), never applied."""
    before, _ = replay(deliveries_of(events), DEFAULT)
    late = Delivery(99, facts(99, progress, "000", done))
    after, outcomes = replay([*deliveries_of(events), late], DEFAULT)
    if before is not None and before.is_final:
        assert outcomes[-1] is Outcome.LATE_PROGRESS
        assert after == before._replace(progress_events=before.progress_events + 1)


def test_incompatible_second_final_is_a_conflict_and_first_stays_c3_p18() -> None:
    """C3/P18: DELIVRD then UNDELIV keeps DELIVERED and flags one conflict (and vice versa)."""
    delivered, undeliverable = facts(1, "DELIVRD"), facts(2, "UNDELIV")
    status, outcome = apply(None, delivered, DEFAULT)
    status, outcome = apply(status, undeliverable, DEFAULT)
    assert outcome is Outcome.CONFLICT
    assert status is not None
    assert status.status is Status.DELIVERED
    assert status.conflicts == 1
    status, _ = apply(None, undeliverable, DEFAULT)
    status, outcome = apply(status, delivered, DEFAULT)
    assert status is not None
    assert status.status is Status.UNDELIVERABLE
    assert status.conflicts == 1


def test_deadline_unknown_is_final_and_not_replaced_by_default_p18() -> None:
    """F3/P18: the deadline UNKNOWN is final; a later DELIVRD is a conflict unless opted in."""
    status, _ = apply(None, facts(1, "UNKNOWN"), DEFAULT)
    assert status is not None
    assert status.is_final
    status, outcome = apply(status, facts(2, "DELIVRD"), DEFAULT)
    assert outcome is Outcome.CONFLICT
    assert status is not None
    assert status.status is Status.UNKNOWN


def test_option_deadline_unknown_superseded_in_either_order_p18() -> None:
    """Option deadline_unknown_superseded: the network final wins whatever the order."""
    unknown, delivered = facts(1, "UNKNOWN"), facts(2, "DELIVRD")
    a, _ = apply(None, unknown, SUPERSEDING)
    a, applied = apply(a, delivered, SUPERSEDING)
    b, _ = apply(None, delivered, SUPERSEDING)
    b, superseded = apply(b, unknown, SUPERSEDING)
    assert (applied, superseded) == (Outcome.APPLIED, Outcome.SUPERSEDED)
    assert a == b
    assert a is not None
    assert a.status is Status.DELIVERED
    assert a.deadline_superseded


def test_unrecognized_stat_is_never_applied_p17() -> None:
    """P17: an unknown stat opens no status and changes none."""
    status, outcome = apply(None, facts(1, "WEIRD"), DEFAULT)
    assert (status, outcome) == (None, Outcome.UNRECOGNIZED)
    held, _ = apply(None, facts(2, "ENROUTE"), DEFAULT)
    assert apply(held, facts(1, "WEIRD"), DEFAULT) == (held, Outcome.UNRECOGNIZED)


def test_newer_progress_wins_by_reported_time_not_arrival_p19() -> None:
    """P19: between two progress events the later done date wins, whichever arrives first."""
    early, late = facts(1, "ENROUTE", done="2611291200"), facts(2, "ACCEPTD", done="2611291230")
    a, _ = apply(apply(None, late, DEFAULT)[0], early, DEFAULT)
    b, _ = apply(apply(None, early, DEFAULT)[0], late, DEFAULT)
    assert a == b
    assert a is not None
    assert a.basis.ref == 2


def test_transition_table_covers_every_pair_p16() -> None:
    """P16: the table is total - no arrival can fall through to an accident."""
    held = [Kind.NONE, Kind.PROGRESS, Kind.NETWORK_FINAL, Kind.DEADLINE_FINAL]
    incoming = [Kind.PROGRESS, Kind.NETWORK_FINAL, Kind.DEADLINE_FINAL, Kind.UNRECOGNIZED]
    assert set(TRANSITIONS) == {(h, i) for h in held for i in incoming}
    assert {kind_of(s) for s in Status} == set(incoming)

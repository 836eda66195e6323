"""The planner (P14-P19, F4, F13) against the independent reference, and its rules one by one."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.parse import fingerprint
from dlrfeed.domain.rules import (
    EMPTY_STATE,
    Delivery,
    MessageState,
    Planner,
    explain,
    is_final,
)
from dlrfeed.domain.sent_records import record_differences
from dlrfeed.domain.status import STAT_TO_STATUS, Outcome, Status
from dlrfeed.domain.transitions import TRANSITIONS, Kind, kind_of
from dlrfeed_tools.oracle import Sent, expect

DEFAULT = IntegrationOptions()
SUPERSEDING = IntegrationOptions(deadline_unknown_superseded=True)
SUBMITTED = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
RECEIVED = datetime(2026, 11, 29, 13, 0, tzinfo=UTC).timestamp()
DONE = {
    None: None,
    "2611291200": datetime(2026, 11, 29, 12, 0, tzinfo=UTC),
    "2611291230": datetime(2026, 11, 29, 12, 30, tzinfo=UTC),
    "2611291155": datetime(2026, 11, 29, 11, 55, tzinfo=UTC),
    "2611291100": datetime(2026, 11, 29, 11, 0, tzinfo=UTC),
    "2611301400": datetime(2026, 11, 30, 14, 0, tzinfo=UTC),
}

Content = tuple[str, int, str, str | None, str | None]
contents = st.tuples(
    st.sampled_from(["a", "A"]),  # two receipt ids of one message (as receipt_ids_hex allows)
    st.sampled_from([0, 1, 1, 2, 2, 3]),
    st.sampled_from(["ACCEPTD", "ENROUTE", "DELIVRD", "UNDELIV", "UNKNOWN", "WEIRD"]),
    st.sampled_from([None, "000"]),
    st.sampled_from(list(DONE)),
)


@st.composite
def arrivals(draw: st.DrawFn) -> list[Content]:
    distinct = draw(st.lists(contents, min_size=1, max_size=6, unique=True))
    return [distinct[i] for i in draw(st.lists(st.integers(0, len(distinct) - 1), min_size=1))]


def deliveries(order: Sequence[Content]) -> list[tuple[Delivery, int, int]]:
    """Each delivery with its event id (one per key) and its arrival number."""
    ids = {"a": 1, "A": 2}
    return [
        (
            Delivery(
                rid,
                "m",
                level,
                STAT_TO_STATUS.get(stat, Status.UNRECOGNIZED),
                stat,
                err,
                DONE[done],
                RECEIVED,
                fingerprint(stat, err, done),
                (),
            ),
            ids[rid] * 10 + level,
            number,
        )
        for number, (rid, level, stat, err, done) in enumerate(order)
    ]


def run(
    order: Sequence[Content], options: IntegrationOptions = DEFAULT
) -> tuple[MessageState, list[Outcome]]:
    planner = Planner(options, {}, {"m": EMPTY_STATE}, {"m": SUBMITTED})
    outcomes = [planner.decide(*d).outcome for d in deliveries(order)]
    return planner.messages["m"], outcomes


@given(order=arrivals(), superseding=st.booleans())
def test_the_planner_is_the_reference(order: list[Content], superseding: bool) -> None:
    """Any deliveries (two receipt ids, levels 0-3, repeats, any order): the planner's status,
    basis, counters, flags and outcomes are the reference's (dlrfeed_tools.oracle)."""
    options = SUPERSEDING if superseding else DEFAULT
    state, outcomes = run(order, options)
    expected = expect(
        [
            Sent(rid, level, stat, err, DONE[done], done, RECEIVED)
            for rid, level, stat, err, done in order
        ],
        submitted_at=SUBMITTED,
        superseding=superseding,
    )
    assert [o.value for o in outcomes] == expected.outcomes
    basis = state.basis
    assert (None if basis is None else basis.status.value) == expected.status
    assert (None if basis is None else basis.reception_id) == expected.basis
    assert (None if basis is None else basis.order_at) == expected.basis_time
    assert is_final(state) == expected.is_final
    assert (state.repeats, state.conflicts, state.progress_events) == (
        expected.repeats,
        expected.conflicts,
        expected.progress_events,
    )
    assert state.deadline_superseded == expected.superseded
    assert state.flags == expected.flags


def test_level_decides_the_kind_f4_f13() -> None:
    """F4: level 1 is progress whatever its stat; level 2 with a final stat is the result,
    with a progress stat it counts as progress; other levels are never applied."""
    assert kind_of(1, Status.DELIVERED) is Kind.PROGRESS
    assert kind_of(2, Status.ENROUTE) is Kind.PROGRESS
    assert kind_of(2, Status.DELIVERED) is Kind.NETWORK_RESULT
    assert kind_of(2, Status.UNKNOWN) is Kind.UNKNOWN_RESULT
    assert kind_of(0, Status.DELIVERED) is Kind.UNEXPECTED_LEVEL
    assert kind_of(3, Status.DELIVERED) is Kind.UNEXPECTED_LEVEL


def test_a_level_1_final_stat_never_makes_a_message_final_and_a_result_follows_f4() -> None:
    state, outcomes = run([("a", 1, "DELIVRD", "000", None), ("a", 2, "UNDELIV", "000", None)])
    assert outcomes == [Outcome.APPLIED, Outcome.APPLIED]
    assert state.basis is not None
    assert state.basis.status is Status.UNDELIVERABLE
    assert state.conflicts == 0
    alone, _ = run([("a", 1, "DELIVRD", "000", None)])
    assert not is_final(alone)
    assert "not final" in explain(alone)


def test_a_level_2_progress_outranks_a_later_level_1_f13() -> None:
    state, outcomes = run(
        [("a", 2, "ENROUTE", None, "2611291200"), ("a", 1, "ACCEPTD", None, "2611291230")]
    )
    assert outcomes == [Outcome.APPLIED, Outcome.LATE_PROGRESS]
    assert state.basis is not None
    assert state.basis.level == 2


def test_a_level_1_progress_update_is_not_a_conflict_p14() -> None:
    """P14: a second level-1 content is a progress update; the newest by reported time wins;
    its redelivery is a repeat."""
    older, newer = ("a", 1, "ENROUTE", None, "2611291200"), ("a", 1, "ENROUTE", None, "2611291230")
    state, outcomes = run([older, newer, newer])
    assert outcomes == [Outcome.APPLIED, Outcome.APPLIED, Outcome.REPEAT]
    assert (state.conflicts, state.repeats, state.progress_events) == (0, 1, 2)
    assert state.basis is not None
    assert state.basis.reception_id == 1


def test_superseding_unknown_under_the_same_key_in_either_order_p18() -> None:
    unknown, delivered = ("a", 2, "UNKNOWN", None, None), ("a", 2, "DELIVRD", "000", None)
    for order in ([unknown, delivered], [delivered, unknown]):
        state, _ = run(order, SUPERSEDING)
        assert state.basis is not None
        assert (state.basis.status, state.deadline_superseded, state.conflicts) == (
            Status.DELIVERED,
            True,
            0,
        )
        off, _ = run(order)
        assert off.conflicts == 1


def test_ties_keep_the_first_arrived_and_are_flagged_p19() -> None:
    dated, undated = ("a", 1, "ENROUTE", None, "2611291200"), ("a", 1, "ACCEPTD", None, None)
    for order in ([dated, undated], [undated, dated]):
        state, _ = run(order)
        assert state.basis is not None
        assert state.basis.reception_id == 0
        assert "arrival_order_tie" in state.flags


def test_implausible_times_are_flagged_and_never_used_p19() -> None:
    before = ("a", 2, "DELIVRD", "000", "2611291100")  # an hour before the submission
    within = ("a", 2, "DELIVRD", "000", "2611291155")  # inside the clock-skew tolerance
    state, _ = run([before])
    assert state.basis is not None
    assert state.basis.order_at is None
    assert "done_date_implausible" in state.flags
    state, _ = run([within])
    assert state.basis is not None
    assert state.basis.order_at == DONE["2611291155"]
    future, _ = run([("a", 2, "DELIVRD", "000", "2611301400")])  # 25 h after receipt
    assert future.basis is not None
    assert future.basis.order_at is None


def test_an_unknown_result_is_described_as_reported_only() -> None:
    state, _ = run([("a", 2, "UNKNOWN", None, None)])
    assert "deadline" not in explain(state)
    assert "UNKNOWN" in explain(state)


def test_transition_table_covers_every_pair_p16() -> None:
    """P16: the table is total - no arrival can fall through to an accident."""
    held = [Kind.NONE, Kind.PROGRESS, Kind.NETWORK_RESULT, Kind.UNKNOWN_RESULT]
    incoming = [
        Kind.PROGRESS,
        Kind.NETWORK_RESULT,
        Kind.UNKNOWN_RESULT,
        Kind.UNRECOGNIZED,
        Kind.UNEXPECTED_LEVEL,
    ]
    assert set(TRANSITIONS) == {(h, i) for h in held for i in incoming}
    assert {kind_of(level, s) for level in (0, 1, 2) for s in Status} == set(incoming)


def test_a_second_record_differs_and_an_identical_one_does_not_p12() -> None:
    first = {
        "internal_id": "i-1",
        "destination_raw": "+34600000001",
        "source": None,
        "route": None,
        "submitted_at": datetime(2026, 11, 29, 12, 0, tzinfo=UTC),
        "dlr_requested": True,
        "dlr_level": None,
    }
    naive_same = {**first, "submitted_at": datetime(2026, 11, 29, 12, 0)}
    assert record_differences(first, naive_same) == []
    assert record_differences(first, {**first, "internal_id": "i-2"}) == ["internal_id"]

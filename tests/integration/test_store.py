"""The receipt store against a real PostgreSQL: C1-C6, C8, concurrency, late correlation."""

from __future__ import annotations

import asyncio
import random
import time

import asyncpg
import pytest

from dlrfeed.domain.options import IntegrationOptions
from dlrfeed.domain.receipt import AckToken, MessageId, Receipt
from dlrfeed.domain.status import Outcome
from dlrfeed.errors import SchemaOutOfDateError, StoreUnavailableError
from dlrfeed.store import Store, Submission, evidence, ingest
from dlrfeed_tools.rule_receipts import feed_receipt
from gateway.receipts.v1 import feed_pb2

LOGIN = "acme"


def receipt(
    message_id: str,
    level: int = 2,
    stat: str = "DELIVRD",
    *,
    err: str | None = "000",
    done_date: str | None = "2611291200",
    text: str | None = None,
    destination: str | None = None,
    delivery_count: int = 1,
) -> Receipt:
    """A receipt as the feed adapter builds it, with the real serialized proto as `raw`."""
    return feed_receipt(
        message_id,
        level,
        stat,
        ack_token=f"tok-{message_id}-{level}",
        received_at=time.time(),
        err=err,
        done_date=done_date,
        submit_date="2611291159",
        text=text,
        destination=destination,
        delivery_count=delivery_count,
    )


async def record(store: Store, *message_ids: str, destination: str = "+34600000001") -> None:
    await store.record_submissions([Submission(LOGIN, m, destination) for m in message_ids])


async def status_of(db: asyncpg.Connection, message_id: str) -> dict[str, object] | None:
    row = await db.fetchrow(
        "SELECT status, is_final, reason, supporting_event_id, repeats, conflicts,"
        " progress_events FROM dlr.message_status WHERE login = $1 AND message_id = $2",
        LOGIN,
        message_id,
    )
    return None if row is None else dict(row)


async def open_exceptions(db: asyncpg.Connection, kind: str) -> list[asyncpg.Record]:
    return await db.fetch(
        "SELECT * FROM dlr.exceptions WHERE kind = $1 AND resolved_at IS NULL ORDER BY id", kind
    )


async def test_c1_same_receipt_again_is_a_repeat_and_changes_only_repeat_counters(
    store: Store, db: asyncpg.Connection
) -> None:
    """C1/C7: a redelivery is a repeat: status, reason, basis and effect counters unchanged."""
    await record(store, "m1")
    first = await store.ingest(LOGIN, [receipt("m1", 1, "ENROUTE"), receipt("m1")])
    assert first.outcomes == [Outcome.APPLIED, Outcome.APPLIED]
    before = await status_of(db, "m1")
    again = await store.ingest(LOGIN, [receipt("m1", delivery_count=2)])
    assert again.outcomes == [Outcome.REPEAT]
    after = await status_of(db, "m1")
    assert before is not None
    assert after is not None
    assert after == {**before, "repeats": 1}
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 3
    assert await db.fetchval("SELECT count(*) FROM dlr.events") == 2
    assert await db.fetchval("SELECT times_received FROM dlr.events WHERE level = 2") == 2
    assert await db.fetchval("SELECT count(*) FROM dlr.exceptions") == 0


async def test_c2_progress_after_final_neither_degrades_nor_overwrites(
    store: Store, db: asyncpg.Connection
) -> None:
    """C2/F13: a progress receipt arriving after the final is recorded as late_progress."""
    await record(store, "m2")
    await store.ingest(LOGIN, [receipt("m2", 2, "DELIVRD")])
    late = await store.ingest(LOGIN, [receipt("m2", 1, "ENROUTE", done_date="2611291100")])
    assert late.outcomes == [Outcome.LATE_PROGRESS]
    status = await status_of(db, "m2")
    assert status is not None
    assert (status["status"], status["is_final"]) == ("DELIVERED", True)
    assert status["progress_events"] == 1
    outcome = await db.fetchval("SELECT outcome FROM dlr.receptions WHERE level = 1")
    assert outcome == "late_progress"


async def test_c3_incompatible_finals_second_preserved_and_flagged(
    store: Store, db: asyncpg.Connection, database_url: str
) -> None:
    """C3/P14/P18: the first result stays; the later one is kept and opens a conflict - under
    one key (same_key_other_content), or, where two receipt ids name one message
    (receipt_ids_hex), across keys (incompatible_final)."""
    await record(store, "m3")
    await store.ingest(LOGIN, [receipt("m3", 2, "DELIVRD")])
    result = await store.ingest(LOGIN, [receipt("m3", 2, "UNDELIV")])
    assert result.outcomes == [Outcome.CONFLICT]
    hex_store = await Store.open(database_url, options=IntegrationOptions(receipt_ids_hex=True))
    try:
        await hex_store.record_submissions([Submission(LOGIN, "26", "+34600000001")])
        await hex_store.ingest(LOGIN, [receipt("1A", 2, "DELIVRD")])
        result = await hex_store.ingest(LOGIN, [receipt("1a", 2, "EXPIRED")])
    finally:
        await hex_store.close()
    assert result.outcomes == [Outcome.CONFLICT]
    for message_id in ("m3", "26"):
        status = await status_of(db, message_id)
        assert status is not None
        assert (status["status"], status["conflicts"]) == ("DELIVERED", 1)
    conflicts = await open_exceptions(db, "conflict")
    causes = sorted(c["details"] for c in conflicts)
    assert len(conflicts) == 2
    assert '"incompatible_final"' in causes[0] + causes[1]
    assert '"same_key_other_content"' in causes[0] + causes[1]
    stored = await db.fetchval(
        "SELECT count(*) FROM dlr.receptions_readable WHERE stat IN ('UNDELIV', 'EXPIRED')"
    )
    assert stored == 2


async def test_c4_unknown_id_bad_dates_unknown_stat_stored_and_flagged(
    store: Store, db: asyncpg.Connection
) -> None:
    """C4: an unknown id, garbage dates and an unknown stat are stored, flagged, not lost."""
    await record(store, "m5")
    result = await store.ingest(
        LOGIN,
        [
            receipt("nobody"),
            receipt("m5", 1, "ENROUTE", done_date="13/13/13"),
            receipt("m5", 2, "DELIVERED!"),
        ],
    )
    assert result.outcomes == [Outcome.UNCORRELATED, Outcome.APPLIED, Outcome.UNRECOGNIZED]
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 3
    assert len(await open_exceptions(db, "uncorrelated")) == 1
    assert len(await open_exceptions(db, "unrecognized")) == 1
    malformed = await open_exceptions(db, "malformed")
    assert [m["message_id"] for m in malformed] == ["m5"]
    flags = await db.fetchval(
        "SELECT flags FROM dlr.receptions_readable WHERE done_date_raw = '13/13/13'"
    )
    assert flags == ["done_date_unparsed"]
    status = await status_of(db, "m5")
    assert status is not None
    assert status["status"] == "ENROUTE"


async def test_c5_unknown_id_with_known_destination_and_text_stays_uncorrelated(
    store: Store, db: asyncpg.Connection
) -> None:
    """C5/P11: same destination and text as a sent message, other id: never assigned."""
    await record(store, "m6", destination="+34600000006")
    result = await store.ingest(
        LOGIN, [receipt("m6-typo", text="hello", destination="+34600000006")]
    )
    assert result.outcomes == [Outcome.UNCORRELATED]
    assert await status_of(db, "m6") is None
    assert await db.fetchval("SELECT count(*) FROM dlr.message_status") == 0
    [waiting] = await open_exceptions(db, "uncorrelated")
    assert waiting["message_id"] == "m6-typo"


async def test_c6_submit_acceptance_dlr_status_and_verification_kept_apart(
    store: Store, db: asyncpg.Connection
) -> None:
    """C6/P2/P3: acceptance is the messages row; the DLR status is labelled as reported."""
    await store.record_submissions(
        [Submission(LOGIN, "m7", "+34600000007", dlr_level=3), Submission(LOGIN, "m8", "+3460")]
    )
    await store.ingest(LOGIN, [receipt("m7")])
    accepted = await db.fetch("SELECT message_id, dlr_requested, dlr_level FROM dlr.messages")
    assert len(accepted) == 2
    assert await status_of(db, "m8") is None  # accepted, no receipt: no status invented (P1)
    status = await status_of(db, "m7")
    assert status is not None
    assert "reported by the network" in str(status["reason"])
    columns = await db.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'dlr'"
        " AND table_name = 'message_status'"
    )
    assert not {"read", "seen", "verified"} & {c[0] for c in columns}


async def test_c8_poison_receipt_isolated_kept_raw_and_the_rest_commit(
    store: Store, db: asyncpg.Connection
) -> None:
    """C8: a receipt the database cannot take is bisected out and kept raw; the rest commit."""
    await record(store, *[f"p{i}" for i in range(9)])
    batch = [receipt(f"p{i}") for i in range(8)]
    # A lone surrogate cannot be encoded as UTF-8: the driver refuses the whole batch.
    poison = receipt("badid")._replace(message_id=MessageId("bad\ud800id"))
    nul = receipt("p8", 1, "ENROUTE", text="a\x00b" + "x" * 2_000_000)
    batch[3:3] = [poison, nul]
    result = await store.ingest(LOGIN, batch)
    assert result.outcomes[3] is Outcome.UNSTORABLE
    assert result.outcomes.count(Outcome.APPLIED) == 9
    assert result.bisections >= 1
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 9
    [unstorable] = await open_exceptions(db, "unstorable")
    assert unstorable["evidence"] == poison.raw
    assert unstorable["message_id"] == "bad\\ud800id"
    stored_text = await db.fetchval(
        "SELECT payload_json->>'text' FROM dlr.receptions_readable WHERE level = 1"
    )
    assert stored_text.startswith("a\\u0000b")
    assert await db.fetchval("SELECT payload FROM dlr.receptions WHERE level = 1") == nul.raw


async def test_connection_loss_raises_store_unavailable_and_commits_nothing(
    store: Store, db: asyncpg.Connection
) -> None:
    """F8/C7: a connection lost mid-batch is a transient error; nothing is committed."""
    await record(store, "held")
    async with db.transaction():
        # Hold the message's row lock so the ingest waits inside its transaction, then kill it.
        await db.execute("SELECT 1 FROM dlr.messages WHERE message_id = 'held' FOR UPDATE")
        ingest = asyncio.create_task(store.ingest(LOGIN, [receipt("other"), receipt("held")]))
        for _ in range(3000):  # up to 30 s: a loaded machine may be slow to reach the lock
            killed = await db.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if killed:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(StoreUnavailableError):
            await ingest
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 0
    assert await db.fetchval("SELECT count(*) FROM dlr.events") == 0
    retried = await store.ingest(LOGIN, [receipt("other"), receipt("held")])
    assert retried.outcomes == [Outcome.UNCORRELATED, Outcome.APPLIED]


async def test_connection_lost_while_bisecting_commits_no_half_c7_c8(
    store: Store, db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C7/C8: the halves of a bisected batch commit together or not at all, so the caller's
    whole-batch retry after a lost connection stores no delivery twice."""
    await record(store, *[f"q{i}" for i in range(4)])
    poison = receipt("badid")._replace(message_id=MessageId("bad\ud800id"))
    batch = [receipt("q0"), receipt("q1"), poison, receipt("q2"), receipt("q3")]

    async def connection_lost(*_: object) -> None:
        raise asyncpg.exceptions.ConnectionDoesNotExistError("connection lost (test)")

    with monkeypatch.context() as patch:
        patch.setattr(evidence, "keep_unstorable", connection_lost)
        with pytest.raises(StoreUnavailableError):
            await store.ingest(LOGIN, batch)
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 0
    retried = await store.ingest(LOGIN, batch)
    assert retried.outcomes.count(Outcome.APPLIED) == 4
    assert retried.outcomes.count(Outcome.REPEAT) == 0
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 4


async def test_reception_ids_follow_the_batch_across_id_blocks_p6(
    store: Store, db: asyncpg.Connection
) -> None:
    """A batch longer than an id block: its receptions get unique ids in batch order, and each
    exception points at its own delivery's reception (the sequence steps a block at a time)."""
    increment = await db.fetchval(
        "SELECT increment FROM information_schema.sequences"
        " WHERE sequence_schema = 'dlr' AND sequence_name = 'receptions_id_seq'"
    )
    assert int(increment) == ingest.RECEPTION_ID_BLOCK
    await store.ingest(LOGIN, [receipt("warm-up")])  # the next batch starts mid-sequence
    count = ingest.RECEPTION_ID_BLOCK + 500
    batch = [receipt(f"unknown-{n:05}") for n in range(count)]  # no message: each uncorrelated
    await store.ingest(LOGIN, batch)
    rows = await db.fetch(
        "SELECT id, message_id FROM dlr.receptions WHERE message_id LIKE 'unknown-%' ORDER BY id"
    )
    assert [r["message_id"] for r in rows] == [r.message_id for r in batch]
    assert len({r["id"] for r in rows}) == count
    linked = await db.fetch(
        "SELECT x.message_id, r.message_id AS reception_message_id"
        " FROM dlr.exceptions AS x LEFT JOIN dlr.receptions AS r ON r.id = x.reception_id"
        " WHERE x.kind = 'uncorrelated' AND x.message_id LIKE 'unknown-%'"
    )
    assert len(linked) == count
    assert all(r["message_id"] == r["reception_message_id"] for r in linked)


async def test_receptions_are_append_only_p13(store: Store, db: asyncpg.Connection) -> None:
    """P13: the database itself refuses UPDATE, DELETE and TRUNCATE of receptions, even to the
    owner: the table by its triggers; the public view is a read-only join."""
    await store.ingest(LOGIN, [receipt("a1")])
    for statement in (
        "UPDATE dlr.reception_rows SET stat = 'X'",
        "DELETE FROM dlr.reception_rows",
        "TRUNCATE dlr.reception_rows",
    ):
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
            await db.execute(statement)
    for statement in ("UPDATE dlr.receptions SET stat = 'X'", "DELETE FROM dlr.receptions"):
        with pytest.raises(asyncpg.ObjectNotInPrerequisiteStateError, match="cannot"):
            await db.execute(statement)
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == 1


async def test_late_correlation_applies_waiting_events_and_resolves_exceptions(
    store: Store, db: asyncpg.Connection
) -> None:
    """P12 + late correlation: events waiting as uncorrelated are applied when recorded."""
    await store.ingest(
        LOGIN,
        [receipt("late", 2, "DELIVRD"), receipt("late", 1, "ENROUTE"), receipt("late")],
    )
    assert await status_of(db, "late") is None
    result = await store.record_submissions([Submission(LOGIN, "late", "0034 600 000 009")])
    assert (result.recorded, result.late_correlated_events) == (1, 2)
    status = await status_of(db, "late")
    assert status is not None
    assert (status["status"], status["repeats"], status["progress_events"]) == ("DELIVERED", 1, 1)
    assert await open_exceptions(db, "uncorrelated") == []
    resolutions = await db.fetch("SELECT resolution FROM dlr.exceptions ORDER BY id")
    assert len(resolutions) == 2
    for (resolution,) in resolutions:
        assert resolution.startswith("correlated late: message late recorded; rules outcome ")
    assert await db.fetchval("SELECT destination FROM dlr.messages") == "+34600000009"
    again = await store.record_submissions([Submission(LOGIN, "late", "+34600000009")])
    assert (again.recorded, again.already_recorded) == (0, 1)


async def test_late_correlation_racing_ingest_never_loses_a_correlation(
    store: Store, db: asyncpg.Connection, database_url: str
) -> None:
    """P12: receipts and their submission recorded at the same moment always meet."""
    other = await Store.open(database_url, pool_size=1)
    try:
        for round_number in range(15):
            ids = [f"race{round_number}-{i}" for i in range(20)]
            await asyncio.gather(
                store.ingest(LOGIN, [receipt(m) for m in ids]),
                other.record_submissions([Submission(LOGIN, m, "+34600000010") for m in ids]),
            )
    finally:
        await other.close()
    assert await open_exceptions(db, "uncorrelated") == []
    assert await db.fetchval("SELECT count(*) FROM dlr.message_status") == 300


async def test_concurrent_ingests_exactly_once_without_deadlock(
    store: Store, db: asyncpg.Connection, database_url: str
) -> None:
    """Several workers, overlapping repeats and conflicting finals: exactly-once effects."""
    message_ids = [f"c{i:03d}" for i in range(150)]
    await record(store, *message_ids)
    deliveries: list[Receipt] = []
    for i, message_id in enumerate(message_ids):
        deliveries += [receipt(message_id, 1, "ENROUTE"), receipt(message_id, 2, "DELIVRD")]
        if i % 10 == 0:
            deliveries.append(receipt(message_id, 2, "UNDELIV"))  # conflicting final
    workers = [await Store.open(database_url, pool_size=1) for _ in range(4)]
    rng = random.Random(7)
    try:
        batches = []
        for _ in range(3):  # every receipt delivered three times, spread over the workers
            copy = deliveries[:]
            rng.shuffle(copy)
            batches += [copy[i : i + 60] for i in range(0, len(copy), 60)]
        rng.shuffle(batches)
        results = await asyncio.gather(
            *(workers[i % 4].ingest(LOGIN, batch) for i, batch in enumerate(batches))
        )
    finally:
        for worker in workers:
            await worker.close()
    total = 3 * len(deliveries)
    assert sum(len(r.outcomes) for r in results) == total
    assert await db.fetchval("SELECT count(*) FROM dlr.receptions") == total
    assert await db.fetchval("SELECT count(*) FROM dlr.events") == 300
    counted = await db.fetchval(
        "SELECT sum(times_received + conflicting_receptions) FROM dlr.events"
    )
    assert counted == total
    # Each logical event goes through the rules exactly once (applied, or late_progress when
    # its final was applied first); every other delivery is a repeat or a conflict.
    first_time = sum(
        r.counts.get(Outcome.APPLIED, 0) + r.counts.get(Outcome.LATE_PROGRESS, 0) for r in results
    )
    assert first_time == 300
    rows = await db.fetch("SELECT * FROM dlr.message_status ORDER BY message_id")
    assert len(rows) == 150
    for i, row in enumerate(rows):
        assert row["is_final"]
        if i % 10 == 0:
            # P14, C1: the conflicting final conflicts once; its redeliveries are repeats.
            assert (row["repeats"], row["conflicts"]) == (6, 1)
            assert row["status"] in ("DELIVERED", "UNDELIVERABLE")
        else:
            assert row["repeats"] == 4  # two events, each delivered three times
            assert (row["status"], row["conflicts"]) == ("DELIVERED", 0)
    assert len(await open_exceptions(db, "conflict")) == 15


async def test_c8_poison_delivered_again_is_one_open_exception_with_every_delivery_kept(
    store: Store, db: asyncpg.Connection
) -> None:
    """C8 + "never counted twice": a poison receipt redelivered (its ack lost, F6) with another
    token and delivery_count keeps one open `unstorable` exception; each delivery's bytes are
    kept, the later ones in rows opened resolved with a pointer to the open one. Once that is
    resolved, a further delivery opens a new investigation."""
    first = receipt("badid")._replace(message_id=MessageId("bad\ud800id"))
    wire = feed_pb2.Receipt.FromString(first.raw)
    wire.ack_token, wire.delivery_count = "tok-2", 2
    again = first._replace(
        ack_token=AckToken("tok-2"), delivery_count=2, raw=wire.SerializeToString()
    )
    assert first.raw != again.raw
    for poison in (first, again, again):
        assert (await store.ingest(LOGIN, [poison])).outcomes == [Outcome.UNSTORABLE]
    [open_one] = await open_exceptions(db, "unstorable")
    assert open_one["evidence"] == first.raw
    rows = await db.fetch(
        "SELECT evidence, resolution FROM dlr.exceptions WHERE kind = 'unstorable' "
        "AND resolved_at IS NOT NULL ORDER BY id"
    )
    assert [r["evidence"] for r in rows] == [again.raw, again.raw]
    assert {r["resolution"] for r in rows} == {
        f"another delivery of the receipt of open exception {open_one['id']}"
    }
    # A different poison receipt is its own investigation.
    other = receipt("otherid")._replace(message_id=MessageId("other\ud800id"))
    await store.ingest(LOGIN, [other])
    assert len(await open_exceptions(db, "unstorable")) == 2
    await db.execute(
        "UPDATE dlr.exceptions SET resolved_at = now(), resolution = 'fixed' WHERE id = $1",
        open_one["id"],
    )
    # Resolved between a redelivery's two statements: the second records nothing, so the
    # store goes round and opens a new investigation instead.
    key = await db.fetchval("SELECT evidence_key FROM dlr.exceptions WHERE id = $1", open_one["id"])
    late = (LOGIN, "bad", "{}", again.raw, key)
    assert await db.fetchval(evidence.RECORD_UNSTORABLE_REDELIVERY.text, *late) is None
    await store.ingest(LOGIN, [first])
    assert len(await open_exceptions(db, "unstorable")) == 2


async def test_schema_changed_under_a_running_store_is_one_line_and_commits_nothing(
    store: Store, db: asyncpg.Connection
) -> None:
    """A migration that runs while a daemon is up (here: a column renamed) makes its statements
    miss: that is not a poison receipt (C8) to bisect and keep as unstorable, but one fatal
    line, exit 78, with nothing committed (the gateway redelivers to the upgraded daemon)."""
    await record(store, "m1")
    await db.execute("ALTER TABLE dlr.reception_rows RENAME COLUMN outcome TO outcome_renamed")
    with pytest.raises(SchemaOutOfDateError) as caught:
        await store.ingest(LOGIN, [receipt("m1")])
    assert caught.value.exit_code == 78
    assert "dlrfeed migrate" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert await db.fetchval("SELECT count(*) FROM dlr.events") == 0
    assert await db.fetchval("SELECT count(*) FROM dlr.exceptions") == 0


async def test_p10_hex_receipt_ids_correlate_by_decimal_value_and_keep_receive_times(
    database_url: str, db: asyncpg.Connection
) -> None:
    """P10/P18 option `receipt_ids_hex`, through the real store: receipt id "1a" correlates with
    the message recorded as "26", the event keeps both ids, and its receive time is ours to the
    microsecond (P19); an id that is its own correlation id is stored as such."""
    hexed = await Store.open(database_url, options=IntegrationOptions(receipt_ids_hex=True))
    try:
        await hexed.record_submissions([Submission(LOGIN, "26", "+34600000001")])
        first = receipt("1a")._replace(received_at=1_795_993_760.123457)
        result = await hexed.ingest(LOGIN, [first, receipt("zz")])
    finally:
        await hexed.close()
    assert result.outcomes == [Outcome.APPLIED, Outcome.UNCORRELATED]
    rows = {
        r["message_id"]: r
        for r in await db.fetch(
            "SELECT message_id, correlation_id, extract(epoch FROM first_received_at) AS at"
            " FROM dlr.events"
        )
    }
    assert rows["1a"]["correlation_id"] == "26"
    assert float(rows["1a"]["at"]) == pytest.approx(1_795_993_760.123457, abs=1e-6)
    # An id that is its own correlation id is not written twice (NULL: its own).
    assert rows["zz"]["correlation_id"] is None
    assert (await status_of(db, "26") or {}).get("status") == "DELIVERED"

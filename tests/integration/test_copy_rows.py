"""`copy_rows`: the store's own binary COPY encoding of receptions, held to the driver's.

The store encodes each reception's receipt fields ahead of the plan and appends the late ones
after it (`dlrfeed.store.copy_rows`); asyncpg's `copy_records_to_table` is the reference. Both
write the same values into twin tables of the real server, which must then hold equal rows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrfeed.domain.parse import PARSER_VERSION, LogicalEvent
from dlrfeed.domain.status import Outcome, Status
from dlrfeed.store import copy_rows
from support.receipt_strategies import examples

# Storable text: parse() has escaped NUL already, and the encoding refuses lone surrogates.
_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
_ZONES = st.sampled_from(
    [UTC, ZoneInfo("Europe/Madrid"), ZoneInfo("America/Bogota"), timezone(timedelta(hours=5.5))]
)
_DATES = st.none() | st.builds(
    lambda naive, zone: naive.replace(tzinfo=zone),
    st.datetimes(datetime(1901, 1, 1), datetime(2200, 1, 1)),
    _ZONES,
)
_INT8 = st.integers(-(2**63), 2**63 - 1)


PLAIN = LogicalEvent(
    message_id="1",
    correlation_id="1",
    level=2,
    stat="DELIVRD",
    status=Status.DELIVERED,
    err="000",
    sub=None,
    dlvrd=None,
    submit_date_raw=None,
    submit_at=None,
    done_date_raw=None,
    done_at=None,
    text=None,
    source_addr=None,
    destination_addr=None,
    smsc_message_id=None,
    connector=None,
    delivery_count=1,
    received_at=0.0,
    raw=b"",
    fingerprint="",
    flags=(),
)


@st.composite
def events(draw: st.DrawFn) -> LogicalEvent:
    return LogicalEvent(
        message_id=draw(_TEXT),
        correlation_id="",
        level=draw(_INT8),
        stat=draw(_TEXT),
        status=Status.UNKNOWN,
        err=draw(st.none() | _TEXT),
        sub=None,
        dlvrd=None,
        submit_date_raw=draw(st.none() | _TEXT),
        submit_at=draw(_DATES),
        done_date_raw=draw(st.none() | _TEXT),
        done_at=draw(_DATES),
        text=None,
        source_addr=None,
        destination_addr=None,
        smsc_message_id=None,
        connector=None,
        delivery_count=draw(_INT8),
        # Our clock: any instant from 1970 to 2100, microseconds included.
        received_at=draw(st.integers(0, 4_102_444_800_000_000)) / 1_000_000,
        raw=draw(st.binary(max_size=64)),
        fingerprint="",
        flags=tuple(draw(st.lists(_TEXT, max_size=3))),
        channel=draw(st.sampled_from(["feed", "webhook"])),
        peer=draw(st.none() | _TEXT),
    )


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    for table in ("by_store", "by_driver"):
        await conn.execute(f"CREATE TABLE {table} (LIKE dlr.reception_rows INCLUDING DEFAULTS)")
    yield conn
    await conn.close()


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def copy_both(
    db: asyncpg.Connection, batch: list[LogicalEvent], outcomes: list[Outcome]
) -> None:
    """The batch copied by the store's encoding into by_store, and by the driver's into
    by_driver."""
    ids = [7 * n + 1 for n in range(len(batch))]
    event_ids = [2**40 + n for n in range(len(batch))]
    rows = copy_rows.encode_receipt_fields(batch)
    columns = copy_rows.COLUMNS
    contents = copy_rows.encode_contents(batch)
    # In two pieces, as the store sends a batch while planning it.
    half = len(batch) // 2
    data = b"".join(
        (
            copy_rows.SIGNATURE,
            copy_rows.complete(
                rows[:half], contents[:half], ids[:half], outcomes[:half], event_ids[:half]
            ),
            copy_rows.complete(
                rows[half:], contents[half:], ids[half:], outcomes[half:], event_ids[half:]
            ),
            copy_rows.TRAILER,
        )
    )
    await db.copy_to_table("by_store", columns=columns, source=_chunks(data), format="binary")
    # The driver's reference encoding of the very same values.
    received = [datetime.fromtimestamp(e.received_at, UTC) for e in batch]
    values = {
        "stat": [e.stat for e in batch],
        "err": [e.err for e in batch],
        "submit_date_raw": [e.submit_date_raw for e in batch],
        "submit_at": [e.submit_at for e in batch],
        "done_date_raw": [e.done_date_raw for e in batch],
        "done_at": [e.done_at for e in batch],
        "delivery_count": [e.delivery_count for e in batch],
        "received_at": received,
        "payload": [e.raw for e in batch],
        "flags": [list(e.flags) for e in batch],
        "parser_version": [PARSER_VERSION] * len(batch),
        "fingerprint": [e.fingerprint for e in batch],
        "channel": [e.channel for e in batch],
        "peer": [e.peer for e in batch],
        "id": ids,
        "outcome": [o.value for o in outcomes],
        "event_id": event_ids,
    }
    await db.copy_records_to_table(
        "by_driver",
        columns=columns,
        records=list(zip(*(values[c] for c in columns), strict=True)),
    )


async def table_rows(db: asyncpg.Connection, table: str) -> list[asyncpg.Record]:
    columns = ", ".join(copy_rows.COLUMNS)
    return list(await db.fetch(f"SELECT {columns} FROM {table} ORDER BY id"))


@given(
    batch=st.lists(events(), min_size=1, max_size=8),
    outcome=st.sampled_from(list(Outcome)),
)
@examples(200)
async def test_the_store_encoding_writes_what_the_driver_writes_p6(
    db: asyncpg.Connection, batch: list[LogicalEvent], outcome: Outcome
) -> None:
    """Any storable values: text of any script, NULLs, int64 bounds, dates of any zone from
    1901 to 2200, empty and non-empty flag arrays, arbitrary payload bytes."""
    await db.execute("TRUNCATE by_store, by_driver")
    await copy_both(db, batch, [outcome] * len(batch))
    by_store = await table_rows(db, "by_store")
    assert len(by_store) == len(batch)
    assert by_store == await table_rows(db, "by_driver")


async def test_shared_dates_and_receive_times_are_each_row_own(db: asyncpg.Connection) -> None:
    """The encoder reuses the encoding of equal dates within a batch; each row still gets its
    own values (and an instant equal across zones is the same timestamptz)."""
    madrid = datetime(2026, 11, 29, 13, 0, tzinfo=ZoneInfo("Europe/Madrid"))
    base = PLAIN
    batch = [
        base._replace(message_id="a", done_at=madrid, submit_at=None, received_at=1.5),
        base._replace(message_id="b", done_at=madrid.astimezone(UTC), received_at=1.5),
        base._replace(message_id="c", done_at=None, submit_at=madrid, received_at=2.25),
    ]
    await copy_both(db, batch, [Outcome.APPLIED, Outcome.REPEAT, Outcome.CONFLICT])
    rows = await table_rows(db, "by_store")
    assert rows == await table_rows(db, "by_driver")
    assert [r["done_at"] for r in rows] == [madrid, madrid, None]
    assert [r["outcome"] for r in rows] == ["applied", "repeat", "conflict"]


async def test_the_two_times_of_a_dst_change_stay_an_hour_apart(db: asyncpg.Connection) -> None:
    """02:30 happens twice in Madrid on 2026-10-25; Python calls the two equal (only `fold`
    differs), the encoder must not reuse one's encoding for the other."""
    first = datetime(2026, 10, 25, 2, 30, tzinfo=ZoneInfo("Europe/Madrid"))
    second = first.replace(fold=1)
    assert first == second  # the trap
    batch = [
        PLAIN._replace(message_id="a", done_at=first),
        PLAIN._replace(message_id="b", done_at=second, submit_at=second),
    ]
    await copy_both(db, batch, [Outcome.APPLIED, Outcome.APPLIED])
    rows = await table_rows(db, "by_store")
    assert rows == await table_rows(db, "by_driver")
    assert rows[1]["done_at"] - rows[0]["done_at"] == timedelta(hours=1)


def test_values_the_driver_refuses_are_refused_alike_c8() -> None:
    """The C8 bisection treats these as data errors: the same exception types as the driver."""
    base = PLAIN
    with pytest.raises(UnicodeEncodeError):
        copy_rows.encode_receipt_fields([base._replace(peer="\ud800")])
    with pytest.raises(OverflowError):
        copy_rows.encode_receipt_fields([base._replace(delivery_count=2**63)])
    with pytest.raises(UnicodeEncodeError):
        copy_rows.encode_contents([base._replace(err="\ud800")])
    rows = copy_rows.encode_receipt_fields([base])
    contents = copy_rows.encode_contents([base])
    with pytest.raises(ValueError, match="zip"):
        copy_rows.complete(rows, contents, [1, 2], [Outcome.APPLIED], [1])


async def test_a_row_that_defers_to_its_event_holds_no_content(db: asyncpg.Connection) -> None:
    """AS_EVENT: the seven content columns NULL, every other field its own."""
    rows = copy_rows.encode_receipt_fields([PLAIN, PLAIN])
    contents = copy_rows.encode_contents([PLAIN, PLAIN])
    data = b"".join(
        (
            copy_rows.SIGNATURE,
            copy_rows.complete(
                rows, [contents[0], copy_rows.AS_EVENT], [1, 2], [Outcome.APPLIED] * 2, [9, 9]
            ),
            copy_rows.TRAILER,
        )
    )
    await db.execute(
        "ALTER TABLE by_store ALTER COLUMN stat DROP NOT NULL,"
        " ALTER COLUMN flags DROP NOT NULL, ALTER COLUMN parser_version DROP NOT NULL"
    )
    await db.copy_to_table(
        "by_store", columns=copy_rows.COLUMNS, source=_chunks(data), format="binary"
    )
    own, deferring = await table_rows(db, "by_store")
    assert [own[c] for c in copy_rows.CONTENT_COLUMNS] == [
        "DELIVRD",
        "000",
        None,
        None,
        [],
        PARSER_VERSION,
        "",
    ]
    assert [deferring[c] for c in copy_rows.CONTENT_COLUMNS] == [None] * 7
    assert [deferring[c] for c in copy_rows.OWN_COLUMNS] == [own[c] for c in copy_rows.OWN_COLUMNS]

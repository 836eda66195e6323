"""The WAL-by-relation benchmark's attribution of pg_walinspect rows (bench.wal_sources)."""

from __future__ import annotations

from dlrfeed_tools.bench.wal_sources import WalShares

NAMES = {"16400": "dlr.events", "16500": "dlr_partitions.status_changes_20261203_message_hash"}


def _row(
    length: int, images: int, block_ref: str | None, manager: str = "Heap"
) -> dict[str, object]:
    return {
        "record_length": length,
        "fpi_length": images,
        "block_ref": block_ref,
        "resource_manager": manager,
    }


def test_a_record_goes_to_its_first_block_and_an_image_to_the_relation_it_images() -> None:
    shares = WalShares()
    shares.add(NAMES, _row(80, 0, "blkref #0: rel 1663/5/16400 fork main blk 7"))
    shares.add(
        NAMES,
        _row(
            8300,
            8192,
            "blkref #0: rel 1663/5/16400 fork main blk 9 "
            "blkref #1: rel 1663/5/16500 fork main blk 3 (FPW); hole: offset: 412, length: 4676",
        ),
    )
    shares.add(NAMES, _row(34, 0, None, manager="Transaction"))

    assert shares.wal == {"dlr.events": 8380, "Transaction": 34}
    assert shares.records == {"dlr.events": 2, "Transaction": 1}
    # The image is the index's, folded over its days; the record that carried it, the table's.
    assert shares.images == {"dlr_partitions.status_changes_DAY_message_hash": 8192}
    assert shares.image_count == {"dlr_partitions.status_changes_DAY_message_hash": 1}


def test_images_of_one_record_share_its_image_bytes_and_unknown_files_keep_their_node() -> None:
    shares = WalShares()
    shares.add(
        NAMES,
        _row(
            9000,
            8000,
            "blkref #0: rel 1663/5/16400 fork main blk 1 (FPW); hole: offset: 40, length: 8 "
            "blkref #1: rel 1663/5/99999 fork main blk 2 (FPW)",
        ),
    )
    assert shares.images == {"dlr.events": 4000, "99999": 4000}

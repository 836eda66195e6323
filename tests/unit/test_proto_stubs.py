"""The committed gRPC stubs must be exactly what `make proto` generates from feed.proto."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "src" / "gateway" / "receipts" / "v1"


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    plugin_dir = Path(sys.executable).parent
    assert shutil.which("protoc-gen-mypy", path=str(plugin_dir)), "mypy-protobuf not installed"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'protos'}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            f"--mypy_out={tmp_path}",
            f"--mypy_grpc_out={tmp_path}",
            str(ROOT / "protos" / "gateway" / "receipts" / "v1" / "feed.proto"),
        ],
        check=True,
        env={"PATH": f"{plugin_dir}:/usr/bin:/bin"},
    )
    fresh = tmp_path / "gateway" / "receipts" / "v1"
    names = sorted(p.name for p in fresh.iterdir())
    assert names == ["feed_pb2.py", "feed_pb2.pyi", "feed_pb2_grpc.py", "feed_pb2_grpc.pyi"]
    for name in names:
        assert (fresh / name).read_text() == (GENERATED / name).read_text(), (
            f"{name} is stale: run `make proto` and commit the result"
        )


def test_receipt_field_numbers_follow_the_contract() -> None:
    from gateway.receipts.v1 import feed_pb2

    fields = {f.name: f.number for f in feed_pb2.Receipt.DESCRIPTOR.fields}
    assert fields == {
        "id": 1,
        "level": 2,
        "stat": 3,
        "err": 4,
        "sub": 5,
        "dlvrd": 6,
        "submit_date": 7,
        "done_date": 8,
        "text": 9,
        "source_addr": 10,
        "destination_addr": 11,
        "smsc_message_id": 12,
        "connector": 13,
        "ack_token": 100,
        "delivery_count": 101,
    }
    optional = {f.name for f in feed_pb2.Receipt.DESCRIPTOR.fields if f.has_presence}
    assert optional == {
        "err",
        "sub",
        "dlvrd",
        "submit_date",
        "done_date",
        "text",
        "source_addr",
        "destination_addr",
        "smsc_message_id",
        "connector",
    }

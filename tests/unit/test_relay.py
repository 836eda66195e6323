"""The relay's pure parts: the signature, the body, where the secret comes from, the checks of
its command line, and the delivery checker of the chaos matrix."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dlrfeed.cli import main
from dlrfeed.commands.relay import RELAY_SECRET
from dlrfeed.errors import ConfigError
from dlrfeed.relay import encode_batch, sign
from dlrfeed.store.changes import StatusChange
from dlrfeed_tools.webhook_receiver import delivery_problems


def _change(
    position: int, message_id: str = "m1", status: str | None = "DELIVERED"
) -> StatusChange:
    return StatusChange(
        position=position,
        login="acme",
        message_id=message_id,
        status=status,
        is_final=True,
        reason="network final",
        previous_status=None,
        previous_is_final=None,
        previous_reason=None,
        supporting_event_id=7,
        rules_version="r1",
        changed_at=datetime(2026, 12, 1, 10, 0, tzinfo=UTC),
    )


def test_signature_is_the_hex_hmac_sha256_of_the_raw_body() -> None:
    body = encode_batch([_change(10**20 + 1)])
    expected = hmac.new(b"k", body, hashlib.sha256).hexdigest()
    assert sign(b"k", body) == f"sha256={expected}"
    assert sign(b"other", body) != sign(b"k", body)


def test_body_holds_every_field_and_the_position_as_an_exact_integer() -> None:
    position = 123456 * 10**19 + 42  # beyond 2^64: JSON integers, never floats
    document = json.loads(encode_batch([_change(position), _change(position + 1, "m2")]))
    first = document["changes"][0]
    assert first["position"] == position
    assert first["changed_at"] == "2026-12-01T10:00:00+00:00"
    assert set(first) >= {
        "position", "login", "message_id", "status", "is_final", "previous_status", "reason",
        "changed_at",
    }  # fmt: skip
    assert [c["message_id"] for c in document["changes"]] == ["m1", "m2"]


def test_a_withdrawn_status_goes_out_as_a_json_null() -> None:
    """A status a recompute deleted is a change with `"status": null` (docs/changes.md)."""
    (change,) = json.loads(encode_batch([_change(5, status=None)]))["changes"]
    assert change["status"] is None
    assert b'"status":null' in encode_batch([_change(5, status=None)])


def test_secret_from_file_then_env_then_systemd_credential(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("from-file\n")
    (tmp_path / "relay-secret").write_text("from-credential")
    assert RELAY_SECRET.resolve(str(tmp_path / "file"), {RELAY_SECRET.env: "x"})[0] == b"from-file"
    assert RELAY_SECRET.resolve(None, {RELAY_SECRET.env: "from-env"})[0] == b"from-env"
    credentials = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert RELAY_SECRET.resolve(None, credentials)[0] == b"from-credential"
    with pytest.raises(ConfigError, match="no relay secret"):
        RELAY_SECRET.resolve(None, {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        RELAY_SECRET.resolve(str(tmp_path / "empty"), {})


def test_secret_on_the_command_line_is_refused_without_echoing_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["relay", "--url", "http://x.example/h", "--secret", "hunter2-secret"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "never accepted on the command line" in err
    assert "hunter2-secret" not in err


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://x.example/h", "expected an http:// or https:// URL"),
        ("https://user:pw@x.example/h", "no credentials in the URL"),
    ],
)
def test_a_bad_url_is_one_line_and_exit_78(
    url: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv(RELAY_SECRET.env, "s")
    code = main(["relay", "--url", url, "--database-url", "postgresql://127.0.0.1:1/x"])
    assert code == 78
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert message in err[0]


def _entry(*positions: int, valid: bool = True) -> dict[str, Any]:
    return {
        "signature_valid": valid,
        "changes": [{"position": p, "login": "acme", "message_id": f"m{p % 2}",
                     "status": "S" + str(p)} for p in positions],
    }  # fmt: skip


def test_delivery_checker_catches_every_kind_of_bad_delivery() -> None:
    logged = [{"position": p, "login": "acme", "message_id": f"m{p % 2}"} for p in (1, 2, 3, 4)]
    statuses = {("acme", "m1"): "S3", ("acme", "m0"): "S4"}
    assert delivery_problems([_entry(1, 2), _entry(1, 2, 3), _entry(4)], logged, statuses) == []
    assert "never delivered" in " ".join(delivery_problems([_entry(1, 2, 4)], logged, statuses))
    assert "invalid signature" in " ".join(
        delivery_problems([_entry(1, 2, 3, 4), _entry(valid=False)], logged, statuses)
    )
    assert "out of position order" in " ".join(
        delivery_problems([_entry(2, 1, 3, 4)], logged, statuses)
    )
    assert "not in the log" in " ".join(
        delivery_problems([_entry(1, 2, 3, 4, 5)], logged, statuses)
    )
    stale = {("acme", "m1"): "S1", ("acme", "m0"): "S4"}
    assert "last delivered change is not its status" in " ".join(
        delivery_problems([_entry(1, 2, 3, 4)], logged, stale)
    )


def test_delivery_checker_takes_a_null_last_change_for_a_message_with_no_status() -> None:
    logged = [{"position": p, "login": "acme", "message_id": "m1"} for p in (1, 3)]
    withdrawn = {"position": 3, "login": "acme", "message_id": "m1", "status": None}
    entries = [{"signature_valid": True, "changes": [_entry(1)["changes"][0], withdrawn]}]
    assert delivery_problems(entries, logged, {}) == []
    assert "not its status" in " ".join(delivery_problems(entries, logged, {("acme", "m1"): "S1"}))
    assert "not its status" in " ".join(delivery_problems([_entry(1)], logged[:1], {}))

"""fakegw's ack tokens and wire bytes, without a server (F9, F4, FD2, FD3)."""

from __future__ import annotations

import pytest

from fakegw.tokens import TokenSigner
from fakegw.wire import (
    delivery_bytes,
    encode_fields,
    normalize_fields,
    pull_response_bytes,
    token_field,
)
from gateway.receipts.v1 import feed_pb2


def test_token_round_trips_for_its_own_login_only() -> None:
    """Decided here: a token names one receipt of one login; another login cannot use it."""
    signer = TokenSigner(b"k" * 32)
    token = signer.issue("acme", 42)
    assert signer.verify("acme", token) == 42
    assert signer.verify("globex", token) is None


def test_token_survives_a_new_signer_with_the_same_key() -> None:
    """F9: a token works across restarts and nodes because the key, not memory, validates it."""
    token = TokenSigner(b"k" * 32).issue("acme", 7)
    assert TokenSigner(b"k" * 32).verify("acme", token) == 7
    assert TokenSigner(b"x" * 32).verify("acme", token) is None


@pytest.mark.parametrize(
    "bad", ["", "!!!", "AQAAAAAAAAAB", "not-a-token-at-all-but-long-enough-to-decode"]
)
def test_malformed_tokens_verify_as_none(bad: str) -> None:
    """Decided here: malformed tokens are already_gone, never an error."""
    assert TokenSigner(b"k" * 32).verify("acme", bad) is None


def test_forged_token_with_one_flipped_character_is_rejected() -> None:
    """Decided here: a forged token (tampered sequence or MAC) verifies as nothing."""
    signer = TokenSigner(b"k" * 32)
    token = signer.issue("acme", 1)
    forged = token[:5] + ("B" if token[5] != "B" else "C") + token[6:]
    assert signer.verify("acme", forged) is None


def test_delivery_bytes_parse_as_a_receipt_with_absent_optionals() -> None:
    """F4: the hand-built wire bytes are a valid Receipt; absent fields stay absent."""
    fields = normalize_fields({"id": "m1", "level": 2, "stat": "DELIVRD", "err": "000"})
    raw = delivery_bytes(encode_fields(fields), token_field("tok"), 3)
    receipt = feed_pb2.Receipt.FromString(raw)
    assert (receipt.id, receipt.level, receipt.stat, receipt.err) == ("m1", 2, "DELIVRD", "000")
    assert (receipt.ack_token, receipt.delivery_count) == ("tok", 3)
    assert receipt.HasField("err")
    assert not receipt.HasField("sub")
    assert not receipt.HasField("text")
    response = feed_pb2.PullResponse.FromString(pull_response_bytes([raw, raw]))
    assert [r.id for r in response.receipts] == ["m1", "m1"]


def test_normalize_rejects_unknown_keys_and_bad_types_but_keeps_odd_content() -> None:
    """Inject validates shape; NUL bytes and unknown stat are relayed as a network would."""
    with pytest.raises(ValueError, match="unknown receipt keys"):
        normalize_fields({"id": "m1", "colour": "red"})
    with pytest.raises(ValueError, match="level"):
        normalize_fields({"id": "m1", "level": "2"})
    odd = normalize_fields({"id": "m\x001", "level": 2, "stat": "WEIRD", "text": "x" * 5000})
    assert odd["id"] == "m\x001"
    assert odd["stat"] == "WEIRD"

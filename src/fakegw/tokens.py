"""Opaque ack tokens, signed with HMAC so they survive restarts and work on any node.

A token names one receipt (its queue sequence number) of one login. The login is not written
into the token: it is part of the signed message, so a token presented by another login fails
verification and answers `already_gone` (FD2, FD3). The key lives in the store, so
every fakegw process that opens the same store accepts the same tokens (F9).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

_SEQ_BYTES = 8
_MAC_BYTES = 16
_RAW_LEN = 1 + _SEQ_BYTES + _MAC_BYTES
_VERSION = b"\x01"


class TokenSigner:
    """Issues and verifies ack tokens for `(login, sequence)` pairs with one secret key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, login: str, seq_bytes: bytes) -> bytes:
        message = login.encode("utf-8") + b"\x00" + seq_bytes
        return hmac.digest(self._key, message, hashlib.sha256)[:_MAC_BYTES]

    def issue(self, login: str, seq: int) -> str:
        """The token for receipt `seq` of `login`: URL-safe base64, no padding."""
        seq_bytes = seq.to_bytes(_SEQ_BYTES, "big")
        raw = _VERSION + seq_bytes + self._mac(login, seq_bytes)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def verify(self, login: str, token: str) -> int | None:
        """The sequence a token names for `login`; None if malformed, forged or foreign."""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            return None
        if len(raw) != _RAW_LEN or raw[:1] != _VERSION:
            return None
        seq_bytes = raw[1 : 1 + _SEQ_BYTES]
        if not hmac.compare_digest(raw[1 + _SEQ_BYTES :], self._mac(login, seq_bytes)):
            return None
        return int.from_bytes(seq_bytes, "big")

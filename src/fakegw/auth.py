"""FD1: the HTTP login's credentials as gRPC metadata `authorization: Basic base64(login:pw)`."""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping


class BasicCredentials:
    """Checks `authorization` header values against the configured logins' passwords."""

    def __init__(self, passwords: Mapping[str, str]) -> None:
        self._passwords = dict(passwords)
        # A client sends the same header on every call; checking it once is enough.
        self._checked: dict[str, str] = {}

    def login_for(self, header: str) -> str | None:
        """The login a header value proves, or None when it is malformed or wrong."""
        login = self._checked.get(header)
        if login is not None:
            return login
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        name, sep, password = decoded.partition(":")
        expected = self._passwords.get(name)
        if not sep or expected is None:
            return None
        if not hmac.compare_digest(password.encode(), expected.encode()):
            return None
        self._checked[header] = name
        return name

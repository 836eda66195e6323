"""Callbacks: the receipts of a message with a `dlr_url` are POSTed there, never queued (F2).

A real gateway calls the webhook of a message that names one; fakegw does the same so that a
receiver of such callbacks can be tested. This module holds the parts without I/O: the
settings, the URL check, the body, and the retry policy. `fakegw.callback_sender` does the
POSTing on the gateway's event loop.
"""

from __future__ import annotations

import email.utils
import enum
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from fakegw.wire import ReceiptFields

# 408 and 429 are "try again later" however 4xx they are; every other 4xx refuses for good.
_RETRYABLE_4XX = frozenset({408, 429})
# Only these statuses carry a Retry-After worth honouring (RFC 9110 §10.2.3).
_RETRY_AFTER_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class CallbackSettings:
    """How fakegw POSTs callbacks: timeouts, retries, concurrency and receiver credentials."""

    timeout_seconds: float = 10.0
    # POSTs of one callback in all, the first included; then it is given up.
    attempts: int = 10
    # The wait after the first failed attempt; it doubles after each one, up to the maximum.
    backoff_seconds: float = 1.0
    max_backoff_seconds: float = 60.0
    # POSTs in flight at once, over one connection pool.
    concurrency: int = 32
    # `Authorization: Bearer` for every login, unless the login has its own token or the URL
    # carries credentials (which win: they are the message's own).
    bearer_token: str | None = None
    login_bearer_tokens: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.timeout_seconds <= 0:
            raise ValueError("the callback timeout must be positive")
        if self.attempts < 1:
            raise ValueError("a callback needs at least one attempt")
        if self.backoff_seconds < 0 or self.max_backoff_seconds < self.backoff_seconds:
            raise ValueError("callback backoff: 0 <= initial <= maximum")
        if self.concurrency < 1:
            raise ValueError("callback concurrency must be at least 1")

    def bearer_for(self, login: str) -> str | None:
        """The bearer token callbacks of `login` carry, if any."""
        return self.login_bearer_tokens.get(login, self.bearer_token)


@dataclass
class Callback:
    """One receipt on its way to a `dlr_url`: what to POST, and how far its retries are."""

    key: str
    login: str
    url: str
    fields: ReceiptFields
    attempts: int = 0  # POSTs made so far
    due_at: float = 0.0  # epoch seconds of the next attempt


def checked_dlr_url(value: object) -> str:
    """A `dlr_url` as given, once it is an absolute http(s) URL with a host; else ValueError
    (TypeError for a value that is not a string)."""
    if not isinstance(value, str):
        raise TypeError(f"dlr_url must be a string, got {value!r}")
    try:
        parts = urlsplit(value)
        # `port` raises ValueError on a port that is not a number in range.
        has_host = bool(parts.hostname) and parts.port != 0
    except ValueError as exc:
        raise ValueError(f"dlr_url is not a URL: {value!r}") from exc
    if parts.scheme not in ("http", "https") or not has_host:
        raise ValueError(f"dlr_url must be an absolute http(s) URL: {value!r}")
    return value


def webhook_body(fields: ReceiptFields) -> bytes:
    """The gateway's webhook JSON: Receipt fields 1-13, one key each, absent ones left out (F4)."""
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class Outcome(enum.Enum):
    """What one POST's answer means for its callback."""

    DELIVERED = "delivered"
    RETRY = "retry"
    REFUSED = "refused"


def outcome_of(status: int | None) -> Outcome:
    """2xx delivers; 408, 429, 5xx, 3xx and no answer at all (None) retry; other 4xx refuse."""
    if status is None:
        return Outcome.RETRY
    if 200 <= status < 300:
        return Outcome.DELIVERED
    if 400 <= status < 500 and status not in _RETRYABLE_4XX:
        return Outcome.REFUSED
    return Outcome.RETRY


def retry_after_seconds(status: int, header: str | None, now: float) -> float | None:
    """The wait a 429 or 503 asks for in `Retry-After` (seconds or an HTTP date), if any."""
    if status not in _RETRY_AFTER_STATUSES or header is None:
        return None
    text = header.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None  # unreadable: the normal backoff applies
    return max(0.0, when.timestamp() - now)


def retry_delay(
    attempts: int, settings: CallbackSettings, rng: random.Random, retry_after: float | None
) -> float:
    """The wait before attempt `attempts + 1`: the receiver's Retry-After when it gave one,
    else exponential backoff with jitter; both capped at the maximum backoff."""
    if retry_after is not None:
        return min(retry_after, settings.max_backoff_seconds)
    doubled = settings.backoff_seconds * 2.0 ** min(attempts - 1, 62)
    # Jitter in [50 %, 100 %] of the step: a burst of failures does not retry in lockstep,
    # and the wait still grows with every attempt.
    return min(doubled, settings.max_backoff_seconds) * (0.5 + rng.random() / 2)

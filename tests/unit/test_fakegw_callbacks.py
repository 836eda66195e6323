"""fakegw's callback policy without I/O: which answers retry, how long the waits are, which
`dlr_url`s are accepted, and the body (F2: the webhook wins; F4: absent fields stay absent)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fakegw.callbacks import (
    CallbackSettings,
    Outcome,
    checked_dlr_url,
    outcome_of,
    retry_after_seconds,
    retry_delay,
    webhook_body,
)

SETTINGS = CallbackSettings(backoff_seconds=1.0, max_backoff_seconds=60.0)


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, Outcome.DELIVERED),
        (204, Outcome.DELIVERED),
        (299, Outcome.DELIVERED),
        (None, Outcome.RETRY),  # a timeout or no connection
        (302, Outcome.RETRY),
        (408, Outcome.RETRY),
        (429, Outcome.RETRY),
        (500, Outcome.RETRY),
        (503, Outcome.RETRY),
        (400, Outcome.REFUSED),
        (401, Outcome.REFUSED),
        (404, Outcome.REFUSED),
        (410, Outcome.REFUSED),
    ],
)
def test_outcome_of_an_answer(status: int | None, outcome: Outcome) -> None:
    assert outcome_of(status) is outcome


def test_retry_after_is_read_only_from_429_and_503() -> None:
    now = 1_000_000.0
    assert retry_after_seconds(429, "7", now) == 7.0
    assert retry_after_seconds(503, " 0 ", now) == 0.0
    assert retry_after_seconds(503, "Mon, 12 Jan 1970 13:46:40 GMT", now) == 0.0
    assert retry_after_seconds(503, "Mon, 12 Jan 1970 13:46:50 GMT", now) == 10.0
    assert retry_after_seconds(500, "7", now) is None
    assert retry_after_seconds(503, None, now) is None
    assert retry_after_seconds(503, "soon", now) is None


@given(attempts=st.integers(1, 10_000), seed=st.integers(0, 2**32))
def test_backoff_doubles_with_jitter_and_stays_under_the_cap(attempts: int, seed: int) -> None:
    delay = retry_delay(attempts, SETTINGS, random.Random(seed), None)
    step = min(SETTINGS.backoff_seconds * 2 ** min(attempts - 1, 62), 60.0)
    assert step / 2 <= delay <= step


def test_retry_after_wins_over_the_backoff_up_to_the_cap() -> None:
    rng = random.Random(0)
    assert retry_delay(5, SETTINGS, rng, 0.0) == 0.0
    assert retry_delay(1, SETTINGS, rng, 30.0) == 30.0
    assert retry_delay(1, SETTINGS, rng, 3600.0) == 60.0


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8080/dlr", "https://hooks.example/dlr?x=1", "http://u:p%40@host/p"],
)
def test_http_urls_are_accepted_as_given(url: str) -> None:
    assert checked_dlr_url(url) == url


@pytest.mark.parametrize(
    "url", ["ftp://host/dlr", "/dlr", "http://", "http://:80/", "http://host:99999/", "x"]
)
def test_other_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="dlr_url"):
        checked_dlr_url(url)


def test_a_dlr_url_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(TypeError, match="dlr_url"):
        checked_dlr_url(7)


def test_the_body_is_the_fields_as_given_and_nothing_else() -> None:
    fields: dict[str, str | int] = {"id": "m1", "level": 2, "stat": "DELIVRD", "text": "grüße"}
    body = webhook_body(fields)
    assert json.loads(body) == fields
    assert "grüße".encode() in body  # UTF-8, not \\u escapes


def test_settings_refuse_nonsense_and_pick_the_login_bearer() -> None:
    with pytest.raises(ValueError, match="attempt"):
        CallbackSettings(attempts=0)
    with pytest.raises(ValueError, match="backoff"):
        CallbackSettings(backoff_seconds=10, max_backoff_seconds=1)
    settings = CallbackSettings(bearer_token="all", login_bearer_tokens={"globex": "own"})
    assert (settings.bearer_for("acme"), settings.bearer_for("globex")) == ("all", "own")

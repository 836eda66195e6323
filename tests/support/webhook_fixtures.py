"""The callback fixtures (tests/fixtures/webhook/, layout in its README): real-shaped callbacks
of the gateway, Jasmin and Kannel, each with the fields it reads to or the reason it is refused.
The format tests read them directly; the receiver's tests send them over HTTP."""

from __future__ import annotations

import json
from typing import Any

from dlrfeed.webhook.formats import Callback, CallbackFormat
from dlrfeed_tools.paths import REPO

FIXTURES = REPO / "tests" / "fixtures" / "webhook"
FIXTURE_NAMES = sorted(path.stem for path in FIXTURES.glob("*.txt"))


def load_fixture(name: str) -> tuple[CallbackFormat, Callback]:
    """A fixture's format (from its name) and callback."""
    head, _, body = (FIXTURES / f"{name}.txt").read_bytes().partition(b"\n\n")
    headers = dict(
        line.partition(": ")[::2]
        for line in head.decode("utf-8").splitlines()
        if not line.startswith("#")
    )
    callback = Callback(
        method=headers.pop("method"),
        query=headers.pop("query", ""),
        content_type=headers.pop("content-type", None),
        body=body.removesuffix(b"\n"),
    )
    assert headers == {}, f"{name}: unknown header lines {headers}"
    return CallbackFormat(name.partition("-")[0]), callback


def expected(name: str) -> Any:
    """What the fixture reads to: its fields as a JSON object, or the reason it is refused."""
    return json.loads((FIXTURES / f"{name}.json").read_text("utf-8"))

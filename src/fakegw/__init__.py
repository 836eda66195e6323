"""fakegw: a faithful, adversarial fake of the gateway's receipt feed (F1-F16, FD1-FD3).

The rules are in docs/spec/feed.md.

It shares nothing with dlrfeed but the generated proto (package `gateway.receipts.v1`).
In-process use: `async with FakeGateway({"login": "password"}).running() as gw: ...`;
other processes use `fakegw serve` and `fakegw.admin_client`. See docs/fakegw.md.
"""

from __future__ import annotations

from fakegw.callbacks import CallbackSettings
from fakegw.faults import Faults
from fakegw.server import FakeGateway
from fakegw.traffic import Scenario, TrafficMix, scenario

__all__ = ["CallbackSettings", "FakeGateway", "Faults", "Scenario", "TrafficMix", "scenario"]

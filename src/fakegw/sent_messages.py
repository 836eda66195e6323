"""The messages the gateway sent (admin `Send`), as F2 and F3 need them.

F2 decides from a message's receipt request which of its receipts reach the feed; F3 gives a
message that reached the receipt deadline without a result one last `UNKNOWN` receipt. The
registrations are journaled, so a restarted gateway still knows its deadlines.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fakegw.persistence import Journal
from fakegw.sending import SentMessage, deadline_receipt, parse_sent_message
from fakegw.wire import ReceiptFields


@dataclass
class DueReceipts:
    """F3's deadline receipts by login: for the feed, and (F2) for a `dlr_url` instead."""

    feed: dict[str, list[ReceiptFields]] = field(default_factory=dict)
    callbacks: dict[str, list[tuple[str, ReceiptFields]]] = field(default_factory=dict)


class SentMessages:
    """Registered sent messages of every login, and their receipt deadlines (F3)."""

    def __init__(self, journal: Journal, deadline_seconds: float) -> None:
        self._journal = journal
        self._deadline_seconds = deadline_seconds
        self._messages: dict[tuple[str, str], SentMessage] = {}
        self._deadlines: list[tuple[float, str, str]] = []  # a heap of (due, login, id)

    def restore(self, rows: Iterable[tuple[str, str, str, float, int]]) -> None:
        """Load the journal's registrations; unresolved ones get their deadline back."""
        for login, _, message_json, sent_at, resolved in rows:
            message = parse_sent_message(login, json.loads(message_json), sent_at)
            message.resolved = bool(resolved)
            self._add(message)

    def register(self, login: str, bodies: Iterable[Mapping[str, Any]], now: float) -> int:
        """Validate and register sent messages (ValueError on a malformed one); how many."""
        parsed = [parse_sent_message(login, body, now) for body in bodies]
        for message in parsed:
            self._add(message)
            self._journal.record_sent(message)
        return len(parsed)

    def _add(self, message: SentMessage) -> None:
        self._messages[(message.login, message.message_id)] = message
        if not message.resolved:
            due = message.sent_at + self._deadline_seconds
            heapq.heappush(self._deadlines, (due, message.login, message.message_id))

    def find(self, login: str, message_id: str) -> SentMessage | None:
        """The message `login` sent with this id, if it was registered."""
        return self._messages.get((login, message_id))

    def resolve(self, message: SentMessage) -> None:
        """The message had its result: no deadline receipt for it (F3)."""
        if not message.resolved:
            message.resolved = True
            self._journal.record_resolved(message.login, message.message_id)

    def due_receipts(self, now: float) -> DueReceipts:
        """F3: resolve every message past its deadline; the deadline receipts F2 lets through."""
        due = DueReceipts()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, login, message_id = heapq.heappop(self._deadlines)
            message = self._messages.get((login, message_id))
            if message is None or message.resolved:
                continue
            self.resolve(message)
            url = message.callback_url(2)
            if url is not None:
                due.callbacks.setdefault(login, []).append((url, deadline_receipt(message, now)))
            elif message.feed_wants(2):
                due.feed.setdefault(login, []).append(deadline_receipt(message, now))
        return due

"""`--mode` and the policies behind it: `FixedMode` for subscribe or pull, `AutoPolicy` for auto.

A policy is pure: the reader (and its batcher) tell it what happened — a stream opened or
closed, receipts seen, a Pull's size, a batch's size, a failure — each with the time it
happened, and ask `mode(now)`: the RPC to use now, both when it opens a call and after each
receipt or Pull, to know whether to leave the current one. No clock, no I/O, no logging:
`switch` tells the reader why the answer changed, for its `auto_switch` log.

Auto's rules (docs/daemon.md, "Modes"): start on Pull - a reader that starts (or restarts)
most likely meets a backlog, which Pull drains for about half the daemon CPU per receipt, and
a store outage costs a Pull reader nothing since it keeps what it pulled
(`dlrfeed.feed.reader`) - and move to Subscribe once three Pulls in a row came back less than
half full. Move to Pull when Subscribe is UNIMPLEMENTED or failed `auto_failures` times within
`auto_cooldown` (Subscribe then blocked for the cool-down), or on a backlog: the stream carried
`auto_pull_rate` receipts/s over a span of `AUTO_RATE_SPAN_SECONDS`, or `BACKLOG_FULL_BATCHES`
batches in a row closed full. Back to Subscribe after three short Pulls in a row again, unless
Subscribe is blocked or a backlog switch is younger than min(`AUTO_MIN_PULL_SECONDS`,
`auto_cooldown`).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Protocol

AUTO_RATE_SPAN_SECONDS = 0.5
"""Auto judges a Subscribe stream's rate over spans this long: short enough that a backlog
moves to Pull within its first few thousand receipts."""

AUTO_MIN_PULL_SECONDS = 10.0
"""After a backlog switch, auto stays on Pull at least this long (capped by --auto-cooldown),
so a steady flow near the threshold does not flap between the RPCs."""

BACKLOG_FULL_BATCHES = 2
"""Consecutive full batches that mean "a backlog" (the feed outruns the commits)."""

CAUGHT_UP_SHORT_PULLS = 3
"""Pulls in a row less than half full that mean "caught up" (Subscribe serves a trickle best)."""


class Mode(enum.StrEnum):
    """`--mode`: which RPC readers use."""

    SUBSCRIBE = "subscribe"
    PULL = "pull"
    AUTO = "auto"


@dataclass(frozen=True, slots=True)
class Switch:
    """Why the policy's answer changed: to which mode, for what reason (the `auto_switch` log)."""

    to: Mode
    reason: str
    cooldown_s: float | None = None


class ModePolicy(Protocol):
    """What a reader asks and tells about its RPC; every event carries its own time."""

    def mode(self, now: float) -> Mode:
        """The RPC to use now."""

    def opened(self, mode: Mode, now: float) -> None:
        """A Subscribe stream or a Pull loop opened."""

    def closed(self) -> None:
        """The stream or Pull loop ended, for whatever reason."""

    def streamed(self, count: int, now: float) -> None:
        """`count` receipts arrived on the open Subscribe stream."""

    def pulled(self, count: int, now: float) -> None:
        """A Pull returned `count` receipts."""

    def batch_closed(self, size: int) -> None:
        """The reader's batcher took a batch of `size` receipts for a commit."""

    def failed(self, mode: Mode, now: float) -> None:
        """The call failed transiently."""

    def unimplemented(self, now: float) -> None:
        """Subscribe answered UNIMPLEMENTED."""

    def take_switch(self) -> Switch | None:
        """The switch decided since the last call, if any (once)."""


class FixedMode:
    """`--mode subscribe` or `--mode pull`: always that RPC, whatever happens."""

    def __init__(self, mode: Mode) -> None:
        self._mode = mode

    def mode(self, now: float) -> Mode:
        return self._mode

    def opened(self, mode: Mode, now: float) -> None:
        return None

    def closed(self) -> None:
        return None

    def streamed(self, count: int, now: float) -> None:
        return None

    def pulled(self, count: int, now: float) -> None:
        return None

    def batch_closed(self, size: int) -> None:
        return None

    def failed(self, mode: Mode, now: float) -> None:
        return None

    def unimplemented(self, now: float) -> None:
        return None

    def take_switch(self) -> Switch | None:
        return None


@dataclass(frozen=True, slots=True)
class AutoSettings:
    """The knobs of auto mode (`dlrfeed run --help`); `batch_size` and `pull_max` say what a
    full batch and a half-full Pull are."""

    batch_size: int
    pull_max: int
    cooldown: float = 60.0
    pull_rate: float = 2000.0
    failures: int = 3


class AutoPolicy:
    """`--mode auto`, fed events; see the module docstring for the rules."""

    def __init__(self, settings: AutoSettings) -> None:
        self._settings = settings
        self._open: Mode | None = None
        # A backlog is expected at the start, or was seen since; cleared once Pulls come back
        # short.
        self._prefer_pull = True
        self._subscribe_blocked_until = float("-inf")  # UNIMPLEMENTED or repeated failures
        self._pull_at_least_until = float("-inf")  # after a backlog switch (no flapping)
        self._failures: deque[float] = deque()  # Subscribe failures within the cool-down
        self._full_streak = 0
        self._span_start = 0.0
        self._span_count = 0
        self._short_pulls = 0
        self._caught_up = False
        self._switch: Switch | None = None

    def mode(self, now: float) -> Mode:
        if self._open is Mode.PULL and not self._caught_up:
            return Mode.PULL  # a Pull loop runs until it has caught up
        if now < self._subscribe_blocked_until or self._prefer_pull:
            return Mode.PULL
        return Mode.SUBSCRIBE

    def opened(self, mode: Mode, now: float) -> None:
        self._open = mode
        self._caught_up = False
        if mode is Mode.SUBSCRIBE:
            # Batches closed before this stream (e.g. of Pulls) say nothing about it.
            self._full_streak = 0
            self._span_start, self._span_count = now, 0
        else:
            self._short_pulls = 0

    def closed(self) -> None:
        self._open = None

    def streamed(self, count: int, now: float) -> None:
        # Two signs of a backlog: batches closing full (the feed outruns the commits), seen at
        # once; or the stream's rate over a short span (the feed is the limit: a stream opened
        # on a backlog delivers its window back to back). The rate is taken over the span's
        # real length, so a burst followed by a quiet spell is not a backlog.
        backlog = self._full_streak >= BACKLOG_FULL_BATCHES
        self._span_count += count
        elapsed = now - self._span_start
        if not backlog and elapsed >= AUTO_RATE_SPAN_SECONDS:
            backlog = self._span_count / elapsed >= self._settings.pull_rate
            self._span_start, self._span_count = now, 0
        if backlog and not self._prefer_pull:
            self._prefer_pull = True
            self._pull_at_least_until = now + min(AUTO_MIN_PULL_SECONDS, self._settings.cooldown)
            self._switch = Switch(Mode.PULL, "backlog")

    def pulled(self, count: int, now: float) -> None:
        short = count < self._settings.pull_max // 2
        self._short_pulls = self._short_pulls + 1 if short else 0
        if (
            self._short_pulls >= CAUGHT_UP_SHORT_PULLS
            and now >= self._subscribe_blocked_until
            and now >= self._pull_at_least_until
        ):
            self._caught_up = True
            self._prefer_pull = False
            self._switch = Switch(Mode.SUBSCRIBE, "caught_up")

    def batch_closed(self, size: int) -> None:
        full = size >= self._settings.batch_size
        self._full_streak = self._full_streak + 1 if full else 0

    def failed(self, mode: Mode, now: float) -> None:
        self._open = None
        if mode is not Mode.SUBSCRIBE:
            return
        window = self._settings.cooldown
        self._failures.append(now)
        while self._failures and now - self._failures[0] > window:
            self._failures.popleft()
        if len(self._failures) >= self._settings.failures:
            self._failures.clear()
            self._subscribe_blocked_until = now + window
            self._switch = Switch(Mode.PULL, "stream_failures", cooldown_s=window)

    def unimplemented(self, now: float) -> None:
        self._open = None
        self._subscribe_blocked_until = now + self._settings.cooldown

    def take_switch(self) -> Switch | None:
        switch, self._switch = self._switch, None
        return switch

"""Progress of a long operator command on stderr: a bar redrawn in place on a terminal, one JSON
line every few seconds otherwise (a journal, a log file, a pipe), and a last one when it ends.

stdout keeps the command's result alone, so a script reading it is not disturbed.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

_BAR = 30
_REDRAW_S = 0.2  # a terminal redraws at most this often
LINE_EVERY_S = 10.0
"""Seconds between two JSON progress lines (not on a terminal)."""


def add_progress_every(parser: argparse.ArgumentParser) -> None:
    """--progress-every: how often a JSON progress line is written when stderr is no terminal."""
    parser.add_argument(
        "--progress-every",
        type=float,
        default=LINE_EVERY_S,
        metavar="SECONDS",
        help="seconds between two JSON progress lines on stderr when it is not a terminal "
        "(a terminal gets a bar)",
    )


class ProgressReport:
    """What a command `task` has done so far (`update`), shown on `stream` (stderr)."""

    def __init__(
        self,
        task: str,
        *,
        unit: str,
        stream: IO[str] | None = None,
        every_s: float = LINE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.task = task
        self.unit = unit
        self.stream = sys.stderr if stream is None else stream
        self.on_terminal = self.stream.isatty()
        self.every_s = _REDRAW_S if self.on_terminal else every_s
        self.clock = clock
        self.started = clock()
        self.shown = self.started
        self.done = 0
        self.total: int | None = None
        self.counts: dict[str, int] = {}

    def update(self, done: int, total: int | None = None, **counts: int) -> None:
        """`done` of `total` units (None: not known) and any counts worth showing; shown when
        the last showing is old enough."""
        self.done, self.total, self.counts = done, total, counts
        if self.clock() - self.shown >= self.every_s:
            self._show(final=False)

    def finish(self) -> None:
        """Show where it ended (the bar's line ended, or a last JSON line)."""
        self._show(final=True)

    def _show(self, *, final: bool) -> None:
        now = self.clock()
        self.shown = now
        elapsed = now - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if not self.on_terminal:
            line = {
                "progress": self.task,
                "done": self.done,
                "total": self.total,
                "unit": self.unit,
                "per_s": round(rate, 1),
                "elapsed_s": round(elapsed, 1),
                "finished": final,
                **self.counts,
            }
            self.stream.write(json.dumps(line) + "\n")
            self.stream.flush()
            return
        extra = "".join(f" {k} {v}" for k, v in self.counts.items())
        if self.total:
            share = min(self.done / self.total, 1.0)
            filled = int(share * _BAR)
            left = (self.total - self.done) / rate if rate > 0 else 0.0
            text = (
                f"{self.task} [{'#' * filled}{'.' * (_BAR - filled)}] {share:4.0%} "
                f"{self.done}/{self.total} {self.unit} {rate:.0f}/s, {left:.0f} s left{extra}"
            )
        else:
            text = f"{self.task}: {self.done} {self.unit}, {rate:.0f}/s{extra}"
        self.stream.write("\r\x1b[K" + text + ("\n" if final else ""))
        self.stream.flush()

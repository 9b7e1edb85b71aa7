"""Progress lines of long data preparation: tokenizing a corpus or a table of conversations, decoding images.

A preparation that runs longer than `runtime` seconds says where it is on stderr, one line every so often, e.g.

    tokenizing train.tsv (data.train_file): 24,000 conversations in 60 s (400 a second)
    tokenizing corpus/*.txt: 12 of 40 parts (30%) in 30 s, about 70 s left

and one line when it ends, once it has said any; a short one says nothing. The interval is
`TPUPLEX_PROGRESS_SECONDS` (10 by default; 0 turns the lines off, as the test sessions do). Only process 0 of a
multi-process run speaks (`tpuplex.hosts.expected_process_index`): every process prepares the same data.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

from tpuplex.hosts import expected_process_index

SECONDS_ENV = "TPUPLEX_PROGRESS_SECONDS"
DEFAULT_SECONDS = 10.0


def interval(env: dict[str, str] | None = None) -> float:
    """Seconds between progress lines: `TPUPLEX_PROGRESS_SECONDS` (a number >= 0; 0: none), else 10."""
    value = (os.environ if env is None else env).get(SECONDS_ENV, "")
    try:
        seconds = float(value) if value.strip() else DEFAULT_SECONDS
    except ValueError:
        return DEFAULT_SECONDS
    return seconds if seconds >= 0 else DEFAULT_SECONDS


class Progress:
    """Counts the `unit`s of `what` done (of `total` when known) and prints a line each `every` seconds (default:
    `interval()`), then a last line at `close` when it printed any."""

    def __init__(self, what: str, unit: str, total: int | None = None, every: float | None = None,
                 clock: Callable[[], float] | None = None, out: TextIO | None = None):
        self.what, self.unit, self.total = what, unit, total
        self.every = interval() if every is None else every
        if expected_process_index() != 0:
            self.every = 0.0
        self.clock, self.out = clock or time.monotonic, out
        self.done = 0
        self.started = self.last = self.clock()
        self.said = False

    def advance(self, count: int = 1) -> None:
        self.done += count
        if self.every > 0:
            now = self.clock()
            if now - self.last >= self.every:
                self.last = now
                self._say(now)

    def close(self) -> None:
        """The last line ("... done: N units in S s"), when a progress line was printed."""
        if self.said:
            elapsed = self.clock() - self.started
            self._print(f"{self.what}: done, {self.done:,} {self.unit} in {elapsed:.0f} s")

    def _say(self, now: float) -> None:
        elapsed = now - self.started
        line = f"{self.what}: {self.done:,}"
        if self.total:
            line += f" of {self.total:,} {self.unit} ({100 * self.done // self.total}%) in {elapsed:.0f} s"
            if 0 < self.done < self.total:
                line += f", about {elapsed * (self.total - self.done) / self.done:.0f} s left"
        else:
            rate = self.done / elapsed if elapsed > 0 else 0.0
            line += f" {self.unit} in {elapsed:.0f} s ({rate:,.0f} a second)"
        self._print(line)

    def _print(self, line: str) -> None:
        self.said = True
        print(line, file=self.out or sys.stderr, flush=True)

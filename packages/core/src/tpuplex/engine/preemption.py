"""Preemption: SIGTERM (a spot VM or TPU being taken back) and SIGINT (Ctrl-C) end a run at the next step boundary
with a checkpoint, instead of wherever the signal lands.

While a `SignalWatch` is entered, either signal only records its name; the Trainer looks at `received` after each
step (or group of steps), writes a checkpoint of the exact data position and raises `Preempted`. A second signal
during that save only records again, so the checkpoint is finished (and it is renamed into place atomically
anyway). The CLI exits with `PREEMPTED_EXIT`; running the same command again resumes from that checkpoint.

Several processes: every process must stop after the same step, so the Trainer OR-combines `received` across them
(`tpuplex.hosts.Hosts.any`) at each step boundary before acting on it; a process that saw no signal itself stops
"by a signal to another process".
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

PREEMPTED_EXIT = 75
"""Exit status after a checkpointed preemption: EX_TEMPFAIL, "try again" (the same command resumes)."""

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(KeyboardInterrupt):
    """A run stopped by a signal after writing `checkpoint` at optimizer step `step`. A KeyboardInterrupt, as the
    Ctrl-C (or a notebook's interrupt) that usually causes it: `except Exception` does not swallow it. `resume` says
    how to go on: the CLI's wording by default, the Python API's where `tpuplex.train` raises it."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path,
                 resume: str = "run the same command again to resume from it"):
        super().__init__(f"stopped by {signal_name} after step {step}; checkpoint {checkpoint}: {resume}")
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint

    def resumed_by(self, resume: str) -> Preempted:
        """The same stop, saying `resume` to go on."""
        return Preempted(self.signal_name, self.step, self.checkpoint, resume)


class SignalWatch:
    """Records SIGTERM/SIGINT instead of dying, while entered (a no-op off the main thread, where Python cannot
    install handlers, and when `enabled` is False: then the signals act as usual)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.received: str | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> SignalWatch:
        if self.enabled:
            for number in SIGNALS:
                self._previous[number] = signal.signal(number, self._record)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _record(self, number: int, frame: FrameType | None) -> None:
        self.received = self.received or signal.Signals(number).name

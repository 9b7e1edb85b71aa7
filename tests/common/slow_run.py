"""Interrupted runs. `start`: `tpuplex train` in a child process made slow where a test needs time to signal it:
with `step_seconds` > 0, from optimizer step `from_step` on (on backends whose state keeps no `step`: from this
process's `from_step`-th step), each step writes its step to `busy` and sleeps `step_seconds`. To be signalled
at an exact point with no race, the child can instead hold there: at this process's `hold_step`-th training step
(announced in `busy`) or inside its `hold_write`-th checkpoint write (announced in `writing` once its first file
is written, before the staging folder is renamed into place), until it is killed or, with `release_after` > 0,
until tpuplex's signal handler has recorded that many signals (counted in `signals`). Nothing else writes the
markers, so a marker seen is the hold itself.
`assert_same_final_state`: what an interrupted run must end with."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tpuplex.engine import checkpoint

NUMPY = "tpuplex.testing.numpy_backend:NumpyBackend"

_SCRIPT = """
import importlib, sys, time
from pathlib import Path
from tpuplex.engine import checkpoint, preemption
from tpuplex.commands.cli import main

module, name = sys.argv[1].split(":")
backend = getattr(importlib.import_module(module), name)
busy, from_step, step_seconds, writing = Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), Path(sys.argv[5])
hold_step, hold_write, release_after = int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8])
signals = busy.parent / "signals"
train_step, save_file, record = backend.train_step, checkpoint.save_file, preemption.SignalWatch._record

calls, writes, recorded = 0, [], 0

def counted_record(self, number, frame):
    global recorded
    record(self, number, frame)
    recorded += 1
    signals.write_text(str(recorded))

def hold(marker, text):
    marker.write_text(text)
    while not release_after or recorded < release_after:  # else until the test kills this process
        time.sleep(0.01)

def slow_train_step(self, state, batch, learning_rate):
    global calls
    step = getattr(state, "step", calls)  # the jax and tf states keep their step on the device
    calls += 1
    if calls == hold_step:
        hold(busy, str(step))
    if step_seconds and step >= from_step:
        busy.write_text(str(step))
        time.sleep(step_seconds)
    return train_step(self, state, batch, learning_rate)

def slow_save_file(tensors, path, metadata=None):
    save_file(tensors, path, metadata=metadata)
    if path.parent not in writes:
        writes.append(path.parent)
        if len(writes) == hold_write:
            hold(writing, str(path))

backend.train_step, checkpoint.save_file = slow_train_step, slow_save_file
preemption.SignalWatch._record = counted_record
sys.exit(main(sys.argv[9:]))
"""


def start(argv: list[str], folder: Path, backend_class: str = NUMPY, from_step: int = 0, step_seconds: float = 0.0,
          hold_step: int = 0, hold_write: int = 0, release_after: int = 0) -> subprocess.Popen:
    """The child `tpuplex <argv>`; its markers are `<folder>/busy`, `<folder>/writing` and `<folder>/signals`
    (stale ones removed). `hold_step` / `hold_write` > 0: it holds at this process's n-th training step /
    checkpoint write, until killed or until `release_after` (> 0) signals are recorded."""
    busy, writing = folder / "busy", folder / "writing"
    for marker in (busy, writing, folder / "signals"):
        marker.unlink(missing_ok=True)
    return subprocess.Popen([sys.executable, "-c", _SCRIPT, backend_class, str(busy), str(from_step),
                             str(step_seconds), str(writing), str(hold_step), str(hold_write), str(release_after),
                             *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 120.0, text: str | None = None) -> None:
    """Until `path` exists (and holds `text`, if given); fails if the child ends first or the time runs out."""
    deadline = time.monotonic() + timeout
    while not path.exists() or (text is not None and path.read_text() != text):
        if process.poll() is not None:
            raise AssertionError(f"the run ended (code {process.returncode}) before {path.name} appeared: "
                                 f"{process.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.01)


def assert_same_final_state(output_dir: Path, reference_dir: Path) -> None:
    """The two runs' last checkpoints hold the same step, data position, parameters, Adam moments and non-trainable
    state (batch-norm statistics), bit for bit."""
    (state, info), (expected, expected_info) = (checkpoint.load(checkpoint.latest(folder / "checkpoints"))
                                                for folder in (output_dir, reference_dir))
    assert state.step == expected.step
    assert (info["epoch"], info["position"]) == (expected_info["epoch"], expected_info["position"])
    for kind in ("params", "exp_avg", "exp_avg_sq", "buffers"):
        ours, theirs = getattr(state, kind), getattr(expected, kind)
        assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours), kind

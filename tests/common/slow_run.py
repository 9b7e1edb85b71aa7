"""Interrupted runs. `start`: `tpuplex train` in a child process made slow where a test needs time to signal it:
from optimizer step `from_step` on (on backends whose state keeps no `step`: from this process's `from_step`-th
step), each step writes its step to `busy` and sleeps `step_seconds`; each checkpoint file, once written, is
announced in `writing` for `write_seconds` (before the staging folder is renamed into place).
`assert_same_final_state`: what an interrupted run must end with."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tpuplex import checkpoint

NUMPY = "tpuplex.testing.numpy_backend:NumpyBackend"

_SCRIPT = """
import importlib, sys, time
from pathlib import Path
from tpuplex import checkpoint
from tpuplex.cli import main

module, name = sys.argv[1].split(":")
backend = getattr(importlib.import_module(module), name)
busy, from_step, step_seconds = Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
writing, write_seconds = Path(sys.argv[5]), float(sys.argv[6])
train_step, save_file = backend.train_step, checkpoint.save_file

calls = 0

def slow_train_step(self, state, batch, learning_rate):
    global calls
    step = getattr(state, "step", calls)  # the jax and tf states keep their step on the device
    calls += 1
    if step >= from_step:
        busy.write_text(str(step))
        time.sleep(step_seconds)
    return train_step(self, state, batch, learning_rate)

def slow_save_file(tensors, path):
    save_file(tensors, path)
    writing.write_text(str(path))
    time.sleep(write_seconds)
    writing.unlink()

backend.train_step, checkpoint.save_file = slow_train_step, slow_save_file
sys.exit(main(sys.argv[7:]))
"""


def start(argv: list[str], folder: Path, backend_class: str = NUMPY, from_step: int = 0, step_seconds: float = 0.0,
          write_seconds: float = 0.0) -> subprocess.Popen:
    """The child `tpuplex <argv>`; its markers are `<folder>/busy` and `<folder>/writing` (stale ones removed)."""
    busy, writing = folder / "busy", folder / "writing"
    busy.unlink(missing_ok=True)
    writing.unlink(missing_ok=True)
    return subprocess.Popen([sys.executable, "-c", _SCRIPT, backend_class, str(busy), str(from_step),
                             str(step_seconds), str(writing), str(write_seconds), *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until `path` exists; fails if the child ends first or the time runs out."""
    deadline = time.monotonic() + timeout
    while not path.exists():
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

"""The kill campaign shared by the core (numpy) and torch sessions: a run SIGKILLed again and again, at random
moments and inside checkpoint writes, then resumed to the end, must equal an uninterrupted run bit for bit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tpuplex import checkpoint, cli

# The backend's train_step sleeps STEP seconds first; checkpoint.save_file writes, then marks `writing` and sleeps
# WRITE seconds, so a kill can land inside a checkpoint write (before the staging folder is renamed into place).
SLOW_RUN = """
import importlib, sys, time
from pathlib import Path
from tpuplex import checkpoint
from tpuplex.cli import main

module, name = sys.argv[1].split(":")
backend, writing, step_seconds, write_seconds = getattr(importlib.import_module(module), name), Path(sys.argv[2]), \\
    float(sys.argv[3]), float(sys.argv[4])
train_step, save_file = backend.train_step, checkpoint.save_file

def slow_train_step(self, state, batch, learning_rate):
    time.sleep(step_seconds)
    return train_step(self, state, batch, learning_rate)

def slow_save_file(tensors, path):
    save_file(tensors, path)
    writing.write_text(str(path))
    time.sleep(write_seconds)
    writing.unlink()

backend.train_step, checkpoint.save_file = slow_train_step, slow_save_file
sys.exit(main(sys.argv[5:]))
"""


def run_campaign(argv: list[str], output_dir: Path, reference_argv: list[str], reference_dir: Path,
                 backend_class: str, kills: int = 10, seed: int = 0, step_seconds: float = 0.05,
                 write_seconds: float = 0.3, startup_seconds: float = 1.0) -> list[str]:
    """Kill the run `argv` (writing to `output_dir`) `kills` times, every third kill inside a checkpoint write and
    the others `startup_seconds` plus a random 0-1.5 s after starting; then finish it and compare it with the
    uninterrupted `reference_argv` run. Returns where each kill landed ("write", or the checkpoint it resumes)."""
    rng = np.random.default_rng(seed)
    writing = output_dir.parent / f"{output_dir.name}.writing"
    landed = []
    for kill in range(kills):
        writing.unlink(missing_ok=True)
        process = subprocess.Popen([sys.executable, "-c", SLOW_RUN, backend_class, str(writing), str(step_seconds),
                                    str(write_seconds), *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True)
        if kill % 3 == 0:
            _wait_for(writing, process)
        else:
            time.sleep(startup_seconds + rng.uniform(0.0, 1.5))
        process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate()
        assert process.returncode == -signal.SIGKILL, f"kill {kill}: the run ended first ({stderr[-500:]})"
        latest = checkpoint.latest(output_dir / "checkpoints")
        landed.append("write" if kill % 3 == 0 else (latest.name if latest else "before any checkpoint"))
    assert cli.main(argv) == 0
    assert cli.main(reference_argv) == 0
    (state, info), (expected, expected_info) = (checkpoint.load(checkpoint.latest(folder / "checkpoints"))
                                                for folder in (output_dir, reference_dir))
    assert state.step == expected.step and info["position"] == expected_info["position"]
    for kind in ("params", "exp_avg", "exp_avg_sq"):
        ours, theirs = getattr(state, kind), getattr(expected, kind)
        assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours), kind
    results, reference = (json.loads((folder / "results.json").read_text()) for folder in (output_dir, reference_dir))
    assert results["metrics"] == reference["metrics"]
    return landed


def _wait_for(path: Path, process: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"the run ended (code {process.returncode}) before writing a checkpoint"
        assert time.monotonic() < deadline, f"no checkpoint write within {timeout} s"
        time.sleep(0.01)

"""The kill campaign shared by the core (numpy), torch and image sessions: a run SIGKILLed again and again, inside
checkpoint writes, at steps after a checkpoint and at random moments of start-up, then resumed to the end, must
equal an uninterrupted run bit for bit."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import numpy as np
import slow_run

from tpuplex.engine import checkpoint

AIMS = ("write", "step", "start-up")
"""Kill i is aimed at AIMS[i % 3]: inside this process's first or second checkpoint write; at a training step
after this process's first checkpoint; a random moment of its first `startup_seconds`."""


def run_campaign(argv: list[str], output_dir: Path, reference_argv: list[str], reference_dir: Path,
                 backend_class: str, kills: int = 10, seed: int = 0, checkpoint_every: int = 1,
                 startup_seconds: float = 1.0) -> list[str]:
    """Kill the run `argv` (writing to `output_dir`, a checkpoint every `checkpoint_every` steps) `kills` times as
    AIMS says, then finish it and compare it with the uninterrupted `reference_argv` run. The aimed kills wait for
    the child to hold at the chosen write or step (`slow_run`), so where they land is no race with a loaded
    machine. Returns where each kill landed, read from the child's own markers and files: "write" when its
    checkpoint writer's `writing` marker was there, else the newest complete checkpoint ("step-…") or "before any
    checkpoint". Asserts that every write-aimed kill landed in a write and at least one kill after a checkpoint."""
    rng = np.random.default_rng(seed)
    landed = []
    for kill in range(kills):
        aim = AIMS[kill % len(AIMS)]
        where = {"write": {"hold_write": 1 + int(rng.integers(2))},
                 "step": {"hold_step": checkpoint_every + 1 + int(rng.integers(3))},
                 "start-up": {"step_seconds": 0.05}}[aim]  # slowed, so the run cannot end before the kill
        process = slow_run.start(argv, output_dir.parent, backend_class, **where)
        if aim == "write":
            slow_run.wait_for(output_dir.parent / "writing", process, timeout=300)
        elif aim == "step":
            slow_run.wait_for(output_dir.parent / "busy", process, timeout=300)
        else:
            time.sleep(rng.uniform(0.0, startup_seconds))
        process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate()
        assert process.returncode == -signal.SIGKILL, f"kill {kill}: the run ended first ({stderr[-500:]})"
        latest = checkpoint.latest(output_dir / "checkpoints")
        inside_write = (output_dir.parent / "writing").exists()
        landed.append("write" if inside_write else (latest.name if latest else "before any checkpoint"))
        assert inside_write or aim != "write", f"kill {kill} was aimed at a checkpoint write and landed outside one"
    assert any(where.startswith("step-") for where in landed), f"no kill landed after a checkpoint: {landed}"
    # Finished, and the reference run, in child processes too: the test's own process may have set its framework
    # up otherwise (the tf session splits its CPU into 8 logical devices, which changes float32 reduction order).
    for finishing in (argv, reference_argv):
        process = slow_run.start(finishing, output_dir.parent, backend_class)
        _, stderr = process.communicate()
        assert process.returncode == 0, stderr[-3000:]
    slow_run.assert_same_final_state(output_dir, reference_dir)
    results, reference = (json.loads((folder / "results.json").read_text()) for folder in (output_dir, reference_dir))
    assert results["metrics"] == reference["metrics"]
    return landed

"""The kill campaign shared by the core (numpy) and torch sessions: a run SIGKILLed again and again, at random
moments and inside checkpoint writes, then resumed to the end, must equal an uninterrupted run bit for bit."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import numpy as np
import slow_run

from tpuplex import checkpoint, cli


def run_campaign(argv: list[str], output_dir: Path, reference_argv: list[str], reference_dir: Path,
                 backend_class: str, kills: int = 10, seed: int = 0, step_seconds: float = 0.05,
                 write_seconds: float = 0.3, startup_seconds: float = 1.0) -> list[str]:
    """Kill the run `argv` (writing to `output_dir`) `kills` times, every third kill inside a checkpoint write and
    the others `startup_seconds` plus a random 0-1.5 s after starting; then finish it and compare it with the
    uninterrupted `reference_argv` run. Returns where each kill landed, read from the child's own marker: "write"
    when its checkpoint writer's `writing` marker was still there (written after the tensors, removed once the
    checkpoint is complete), else the checkpoint the run resumes from. Every aimed kill must land in a write."""
    rng = np.random.default_rng(seed)
    landed = []
    for kill in range(kills):
        process = slow_run.start(argv, output_dir.parent, backend_class, step_seconds=step_seconds,
                                 write_seconds=write_seconds)
        if kill % 3 == 0:
            slow_run.wait_for(output_dir.parent / "writing", process)
        else:
            time.sleep(startup_seconds + rng.uniform(0.0, 1.5))
        process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate()
        assert process.returncode == -signal.SIGKILL, f"kill {kill}: the run ended first ({stderr[-500:]})"
        latest = checkpoint.latest(output_dir / "checkpoints")
        inside_write = (output_dir.parent / "writing").exists()
        assert inside_write or kill % 3, f"kill {kill} was aimed at a checkpoint write and landed outside one"
        landed.append("write" if inside_write else (latest.name if latest else "before any checkpoint"))
    assert cli.main(argv) == 0
    assert cli.main(reference_argv) == 0
    slow_run.assert_same_final_state(output_dir, reference_dir)
    results, reference = (json.loads((folder / "results.json").read_text()) for folder in (output_dir, reference_dir))
    assert results["metrics"] == reference["metrics"]
    return landed


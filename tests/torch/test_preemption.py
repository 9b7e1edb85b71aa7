"""SIGTERM to a single-process run on the torch backend (a tiny BERT on tiny MRPC, through the CLI): it finishes
the running step, writes that step's checkpoint and exits with status 75, and the same command resumes it to the
uninterrupted run's parameters, Adam moments and metrics (the numpy form of this is tests/core/test_preemption.py)."""

from __future__ import annotations

import json
import signal

import slow_run
from tiny_glue import write_run_config, write_tiny_model, write_tiny_mrpc

from tpuplex.commands import cli
from tpuplex.engine import checkpoint
from tpuplex.engine.preemption import PREEMPTED_EXIT

HOLD_AT = 3
"""The run holds inside its third update until the signal is recorded (checkpoints come every 4)."""


def test_sigterm_checkpoints_the_running_step_exits_75_and_resumes(tmp_path, capsys) -> None:
    model, mrpc = write_tiny_model(tmp_path / "model"), write_tiny_mrpc(tmp_path / "MRPC")
    path = write_run_config(tmp_path, model, mrpc, train__epochs=1, runtime__checkpoint_every=4)
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"

    def argv(output_dir):
        return ["train", str(path), "--backend", "torch", "--set", f"runtime.output_dir={json.dumps(str(output_dir))}"]

    process = slow_run.start(argv(stopped), tmp_path, "tpuplex_torch.backend:TorchBackend", hold_step=HOLD_AT,
                             release_after=1)
    slow_run.wait_for(tmp_path / "busy", process, timeout=300)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == PREEMPTED_EXIT, stderr
    assert f"tpuplex: stopped by SIGTERM after step {HOLD_AT};" in stderr
    latest = checkpoint.latest(stopped / "checkpoints")
    assert latest.name == f"step-{HOLD_AT:08d}" and checkpoint.verify(latest) is None
    assert not (stopped / "results.json").exists()

    assert cli.main(argv(stopped)) == 0
    assert cli.main(argv(whole)) == 0
    capsys.readouterr()
    resumed = json.loads((stopped / "results.json").read_text())
    assert resumed["resumed_from"] == str(latest)
    assert resumed["metrics"] == json.loads((whole / "results.json").read_text())["metrics"]
    slow_run.assert_same_final_state(stopped, whole)

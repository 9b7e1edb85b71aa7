"""Preemption and damaged checkpoints through the CLI on the numpy backend: SIGTERM / SIGINT checkpoint the step
that was running and exit 75, and the same command resumes bit-identically; a damaged latest checkpoint is
reported and the previous one used."""

from __future__ import annotations

import json
import signal

import pytest
import slow_run

from tpuplex.commands import cli
from tpuplex.engine import checkpoint
from tpuplex.engine.preemption import PREEMPTED_EXIT

HANG_AT, CHECKPOINT_EVERY = 5, 4
"""The run holds inside update HANG_AT + 1 (off the checkpoint cadence) until the signal is recorded."""


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_checkpoints_the_running_step_and_the_same_command_resumes(signal_number, write_config, tmp_path,
                                                                           capsys) -> None:
    common = ["--set", f"runtime.checkpoint_every={CHECKPOINT_EVERY}", "--set", "runtime.log_every=1"]
    stopped_dir, whole_dir = tmp_path / "stopped", tmp_path / "whole"
    path = write_config()
    argv = ["train", str(path), "--backend", "numpy", *common,
            "--set", f"runtime.output_dir={json.dumps(str(stopped_dir))}"]
    process = slow_run.start(argv, tmp_path, hold_step=HANG_AT + 1, release_after=1)
    slow_run.wait_for(tmp_path / "busy", process)
    process.send_signal(signal_number)
    _, stderr = process.communicate(timeout=300)

    assert process.returncode == PREEMPTED_EXIT, stderr
    name = signal.Signals(signal_number).name
    stopped = stderr.strip().splitlines()[-1]
    assert stopped.startswith(f"tpuplex: stopped by {name} after step ") and stopped.endswith(
        ": run the same command again to resume from it")
    step = int(stopped.split("after step ")[1].split(";")[0])
    assert step == HANG_AT + 1 and step % CHECKPOINT_EVERY != 0  # the running step, off the cadence, and no more
    latest = checkpoint.latest(stopped_dir / "checkpoints")
    assert latest.name == f"step-{step:08d}" and checkpoint.verify(latest) is None
    assert json.loads((latest / "trainer.json").read_text())["position"] == step
    records = [json.loads(line) for line in (stopped_dir / "log.jsonl").read_text().splitlines()]
    assert records[-1]["event"] == "preempted" and records[-1]["signal"] == name
    assert not (stopped_dir / "results.json").exists()

    assert cli.main(argv) == 0
    assert cli.main(["train", str(path), "--backend", "numpy", *common,
                     "--set", f"runtime.output_dir={json.dumps(str(whole_dir))}"]) == 0
    capsys.readouterr()
    resumed = json.loads((stopped_dir / "results.json").read_text())
    assert resumed["resumed_from"] == str(latest)
    assert resumed["metrics"] == json.loads((whole_dir / "results.json").read_text())["metrics"]
    slow_run.assert_same_final_state(stopped_dir, whole_dir)


def test_on_preempt_exit_leaves_the_signal_alone(write_config, tmp_path) -> None:
    path = write_config()
    argv = ["train", str(path), "--backend", "numpy", "--set", 'runtime.on_preempt="exit"']
    process = slow_run.start(argv, tmp_path, hold_step=HANG_AT + 1, release_after=1)
    slow_run.wait_for(tmp_path / "busy", process)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=300)
    assert process.returncode == -signal.SIGTERM
    assert checkpoint.latest(tmp_path / "run" / "checkpoints") is None  # the first epoch had not ended


@pytest.mark.parametrize("damage", ["truncated model.safetensors", "trainer.json not JSON", "missing file"])
def test_a_damaged_latest_checkpoint_resumes_from_the_previous_one(damage, write_config, tmp_path, capsys) -> None:
    from test_checkpoint import DAMAGES

    common = ["--set", "runtime.checkpoint_every=3", "--set", "runtime.keep_checkpoints=10"]
    path = write_config()
    argv = ["train", str(path), "--backend", "numpy", *common]
    assert cli.main(argv) == 0
    whole = json.loads((tmp_path / "run" / "results.json").read_text())
    final = checkpoint.latest(tmp_path / "run" / "checkpoints")
    reference = tmp_path / "reference"
    (reference / "checkpoints").mkdir(parents=True)
    final.rename(reference / "checkpoints" / final.name)
    assert cli.main(argv) == 0  # the same run again, from the checkpoint before the final one
    corrupt, problem = DAMAGES[damage]
    corrupt(checkpoint.latest(tmp_path / "run" / "checkpoints"))
    capsys.readouterr()

    assert cli.main(argv) == 0
    said = "".join(capsys.readouterr())
    damaged = tmp_path / "run" / "checkpoints" / final.name
    assert f"skipping damaged checkpoint {damaged} ({problem}" in said
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["resumed_from"] != str(damaged) and results["metrics"] == whole["metrics"]
    slow_run.assert_same_final_state(tmp_path / "run", reference)


def test_only_damaged_checkpoints_is_one_clear_error(write_config, tmp_path, capsys) -> None:
    path = write_config()
    argv = ["train", str(path), "--backend", "numpy", "--set", "train.max_steps=2"]
    assert cli.main(argv) == 0
    (checkpoint.latest(tmp_path / "run" / "checkpoints") / "manifest.json").unlink()
    capsys.readouterr()
    assert cli.main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tpuplex: error:")]
    assert len(errors) == 1
    assert errors[0].startswith("tpuplex: error: no usable checkpoint in ")
    assert "(step-00000002: no manifest.json)" in errors[0]


def test_signals_during_a_checkpoint_write_let_it_finish(write_config, tmp_path) -> None:
    path = write_config(runtime__checkpoint_every=3)
    process = slow_run.start(["train", str(path), "--backend", "numpy"], tmp_path, hold_write=1, release_after=2)
    slow_run.wait_for(tmp_path / "writing", process)  # inside the step-3 checkpoint's write, before its rename
    for count in ("1", "2"):  # the second once the first is recorded: two signals at once may arrive as one
        process.send_signal(signal.SIGTERM)
        slow_run.wait_for(tmp_path / "signals", process, text=count)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == PREEMPTED_EXIT, stderr
    assert "stopped by SIGTERM after step 3;" in stderr
    latest = checkpoint.latest(tmp_path / "run" / "checkpoints")
    assert latest.name == "step-00000003" and checkpoint.verify(latest) is None
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["step-00000003"]  # no staging left

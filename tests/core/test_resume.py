"""Exact resume: a run killed with SIGKILL mid-epoch and resumed ends bit-identical to an uninterrupted run."""

from __future__ import annotations

import itertools
import json
import os
import signal
from pathlib import Path

import numpy as np
import slow_run

from tpuplex import config as config_lib
from tpuplex.commands import cli, run
from tpuplex.engine import checkpoint

CHECKPOINT_EVERY, HANG_AT = 4, 6  # steps 5 and 6 are done but never checkpointed when the kill comes


def logged_losses(output_dir: Path) -> dict[int, float]:
    """Step -> training loss from log.jsonl (the last record of a step wins: a resumed run logs it again)."""
    records = [json.loads(line) for line in (output_dir / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["event"] == "train"}


def test_sigkill_mid_epoch_then_resume_is_bit_identical(write_config, tmp_path, capsys) -> None:
    common = ["--set", f"runtime.checkpoint_every={CHECKPOINT_EVERY}", "--set", "runtime.log_every=1",
              "--set", "runtime.keep_checkpoints=5"]
    killed_dir, whole_dir = tmp_path / "killed", tmp_path / "whole"
    path = write_config()

    argv = ["train", str(path), "--backend", "numpy", *common,
            "--set", f"runtime.output_dir={json.dumps(str(killed_dir))}"]
    process = slow_run.start(argv, tmp_path, from_step=HANG_AT, step_seconds=600)
    try:
        slow_run.wait_for(tmp_path / "busy", process)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL
    interrupted = checkpoint.latest(killed_dir / "checkpoints")
    info = json.loads((interrupted / "trainer.json").read_text())
    assert (info["step"], info["epoch"], info["position"]) == (CHECKPOINT_EVERY, 0, CHECKPOINT_EVERY)
    assert not (killed_dir / "results.json").exists()

    assert cli.main(argv) == 0
    assert cli.main(["train", str(path), "--backend", "numpy", *common,
                     "--set", f"runtime.output_dir={json.dumps(str(whole_dir))}"]) == 0
    capsys.readouterr()

    resumed = json.loads((killed_dir / "results.json").read_text())
    whole = json.loads((whole_dir / "results.json").read_text())
    assert resumed["resumed_from"] == str(interrupted)
    assert resumed["losses"]["first_step"] == CHECKPOINT_EVERY + 1 and resumed["step"] == whole["step"]
    assert resumed["metrics"] == whole["metrics"]
    slow_run.assert_same_final_state(killed_dir, whole_dir)
    assert logged_losses(killed_dir) == logged_losses(whole_dir)
    # The resumed run read the training records of steps 5 on, and none of the 4 steps it skipped (measured by
    # the prepared split's reader): each batch reads its distinct rows, the real ones.
    batcher = run.prepare(config_lib.load(path), "numpy").trainer.train_batcher
    skipped = sum(int(np.count_nonzero(batch["weight"]))
                  for batch in itertools.islice(batcher.train_batches(0), CHECKPOINT_EVERY))
    assert resumed["train_reads"][0]["records"] == whole["train_reads"][0]["records"] - skipped
    assert whole["train_reads"][0]["records"] == whole["total_steps"] // whole["steps_per_epoch"] * len(batcher.data)


def test_resuming_with_another_config_is_refused(write_config, tmp_path, capsys) -> None:
    path = write_config()
    assert cli.main(["train", str(path), "--backend", "numpy", "--set", "train.max_steps=3"]) == 0
    capsys.readouterr()
    assert cli.main(["train", str(path), "--backend", "numpy", "--set", "train.max_steps=3",
                     "--set", "train.learning_rate=0.01"]) == 2
    err = capsys.readouterr().err
    assert "was written with another configuration" in err and "set a new runtime.output_dir" in err


def test_raising_max_steps_extends_a_finished_run_and_lowering_it_is_refused(write_config, tmp_path,
                                                                              capsys) -> None:
    path = write_config()
    argv = ["train", str(path), "--backend", "numpy", "--set", "runtime.log_every=1"]
    assert cli.main([*argv, "--set", "train.max_steps=3"]) == 0
    first = logged_losses(tmp_path / "run")
    capsys.readouterr()
    assert cli.main([*argv, "--set", "train.max_steps=5"]) == 0
    err = capsys.readouterr().err
    assert ("the run now trains 5 steps, not 3 (train.max_steps = 5): its learning-rate schedule now spans 5 "
            "steps (lr") in err
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["resumed_from"].endswith("step-00000003") and results["losses"]["first_step"] == 4
    assert results["step"] == results["total_steps"] == 5
    assert {step: loss for step, loss in logged_losses(tmp_path / "run").items() if step <= 3} == first
    assert cli.main([*argv, "--set", "train.max_steps=4"]) == 2
    err = capsys.readouterr().err
    assert "is at step 5, past the 4 steps this config trains (train.max_steps = 4): raise it to at least 5" in err
    assert json.loads((tmp_path / "run" / "results.json").read_text()) == results  # nothing rewritten


def test_changing_only_the_output_cadence_resumes(write_config, tmp_path) -> None:
    path = write_config()
    assert cli.main(["train", str(path), "--backend", "numpy", "--set", "train.max_steps=3"]) == 0
    assert cli.main(["train", str(path), "--backend", "numpy", "--set", "train.max_steps=3",
                     "--set", "runtime.log_every=1", "--set", "runtime.keep_checkpoints=4"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["resumed_from"].endswith("step-00000003")


def test_rerunning_a_finished_run_trains_no_more(write_config, tmp_path, capsys) -> None:
    path = write_config()
    argv = ["train", str(path), "--backend", "numpy", "--set", "train.max_steps=4"]
    assert cli.main(argv) == 0
    first = json.loads((tmp_path / "run" / "results.json").read_text())
    assert cli.main(argv) == 0
    again = json.loads((tmp_path / "run" / "results.json").read_text())
    assert again["losses"] == {"steps": 0} and again["step"] == first["step"] == 4
    assert again["metrics"] == first["metrics"]
    assert again["resumed_from"].endswith("step-00000004")


def test_resuming_on_other_training_data_is_refused(write_config, tiny_mrpc, tmp_path, capsys) -> None:
    data = tmp_path / "MRPC"
    data.mkdir()
    for name in ("train.tsv", "dev.tsv"):
        (data / name).write_text((tiny_mrpc / name).read_text(encoding="utf-8"), encoding="utf-8")
    path = write_config(data__data_dir=str(data))
    argv = ["train", str(path), "--backend", "numpy", "--set", "train.max_steps=3"]
    assert cli.main(argv) == 0
    lines = (data / "train.tsv").read_text(encoding="utf-8").splitlines()
    label, rest = lines[1].split("\t", 1)
    lines[1] = f"{1 - int(label)}\t{rest}"  # the same size and sentences, one label flipped
    (data / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert cli.main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tpuplex: error:")]
    assert len(errors) == 1 and "was trained on other training data (tokens and labels differ)" in errors[0]


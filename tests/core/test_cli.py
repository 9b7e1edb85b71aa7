"""The `tpuplex` command end to end with the numpy backend: a whole run, `devices`, and bad input."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpuplex import config as config_lib
from tpuplex import registry
from tpuplex.commands import cli


def run_module(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m tpuplex ARGS` in a fresh interpreter, as a user would run it."""
    return subprocess.run([sys.executable, "-m", "tpuplex", *args], capture_output=True, text=True, cwd=cwd,
                          check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)


def test_a_whole_run_writes_results_logs_tensorboard_and_checkpoints(write_config, tmp_path) -> None:
    path = write_config(runtime__checkpoint_every=5)
    done = run_module("train", str(path), "--backend", "numpy", "--set", "train.epochs=3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    run = tmp_path / "run"
    results = json.loads((run / "results.json").read_text())
    config = config_lib.load(path, ["train.epochs=3"])

    assert (results["dataset"], results["backend"]) == ("mrpc", "numpy")
    assert results["topology"].startswith("cpu x1")
    assert set(results["metrics"]) == {"dev"}
    assert {"accuracy", "f1", "score", "loss"} <= set(results["metrics"]["dev"])
    assert results["step"] == results["total_steps"] == 3 * results["steps_per_epoch"]
    assert results["train"]["examples"] == results["step"] * config.train.global_batch
    assert results["eval"]["examples"] == 37 * 3  # the dev split, once at the end of each epoch
    assert results["train"]["examples_per_s"] > 0 and results["eval"]["tokens_per_s"] > 0
    assert 0 <= results["train"]["input_wait_share"] < 1 and results["train"]["input_wait_seconds"] >= 0
    # The model's FLOPs over the training seconds, and their share of this CPU's measured peak.
    train, peak = results["train"], results["peak"]
    assert "measured" in peak["source"] and train["model_tflops_per_s"] > 0 and results["eval"]["mfu"] is None
    share = train["model_tflops_per_s"] / peak["tflops_per_s"]
    # A peak measured under one load cannot bound seconds run under a heavier one: a share above 1 is left out.
    assert train["mfu"] == pytest.approx(share, rel=2e-3) if share <= 1 else train["mfu"] is None
    assert 0 < results["padding_efficiency"]["train"] <= 1 and 0 < results["padding_efficiency"]["dev"] <= 1
    # Train and predict programs, each for at most every bucket length (16, 24 and max_length 32).
    assert 1 <= results["compile_count"] <= 2 * 3
    by_epoch = results["compile_count_by_epoch"]
    assert list(by_epoch) == ["1", "2", "3"] and len(set(by_epoch.values())) == 1  # none after the first epoch
    assert results["config_hash"] == config.hash()
    assert results["config_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert results["losses"]["steps"] == results["step"]
    assert f"dev: accuracy {results['metrics']['dev']['accuracy']:.4f}" in done.stdout

    events = [json.loads(line)["event"] for line in (run / "log.jsonl").read_text().splitlines()]
    assert events[0] == "start" and {"train", "eval", "checkpoint"} <= set(events)
    tensorboard = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(tensorboard) == 1 and tensorboard[0].stat().st_size > 0
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert kept == [f"step-{s:08d}" for s in sorted({*range(5, results["step"] + 1, 5), results["step"]})[-2:]]
    assert list((tmp_path / "cache").glob("mrpc-*/manifest.json"))


def test_data_dir_flag_and_overrides(write_config, tmp_path, tiny_mrpc, capsys) -> None:
    path = write_config(data__data_dir="/nonexistent/overridden/by/the/flag")
    code = cli.main(["train", str(path), "--backend", "numpy", "--data-dir", str(tiny_mrpc),
                     "--set", "train.max_steps=3", "--set", "runtime.output_dir=" + json.dumps(str(tmp_path / "o"))])
    assert code == 0, capsys.readouterr().err
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert results["step"] == 3 and results["config"]["data"]["data_dir"] == str(tiny_mrpc)


def test_output_dir_placeholders(write_config, tmp_path, capsys) -> None:
    out = json.dumps(str(tmp_path / "runs" / "{dataset}-{task}-{backend}"))
    path = write_config()
    assert cli.main(["train", str(path), "--backend", "numpy", "--set", "train.max_steps=2",
                     "--set", f"runtime.output_dir={out}"]) == 0
    assert (tmp_path / "runs" / "mrpc-sequence_classification-numpy" / "results.json").is_file()
    assert cli.main(["train", str(path), "--backend", "numpy", "--set", 'runtime.output_dir="runs/{model}"']) == 2
    assert "only {dataset}, {task} and {backend}" in capsys.readouterr().err


def test_devices_lists_core_discovery_and_each_backend(capsys) -> None:
    assert cli.main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("core discovery: ")
    assert any(line.startswith("backend numpy: cpu x1 (1 process) via numpy") for line in lines)
    for name, command in registry.INSTALL.items():
        if name not in registry.available():
            assert f"backend {name}: not installed ({command})" in lines


# -- bad input: one line on stderr, exit code 2, nothing half-written -------------------------------------------


CASES = {
    "missing data directory": ({"data__data_dir": "/nonexistent/MRPC"}, [], "/nonexistent/MRPC does not exist"),
    "file missing a column": ({"data__data_dir": "missing column"}, [], "has no column 'Quality'"),
    "label outside the task's labels": ({"data__data_dir": "bad train label"}, [], "label '2' is not a mrpc label"),
    "empty split": ({"data__data_dir": "empty train"}, [], "holds no examples"),
    "unknown task": ({}, ["--set", "data.dataset=glue9"], "unknown GLUE dataset 'glue9'"),
    "batch not divisible by replicas": ({}, ["--set", "runtime.cpu_devices=3"],
                                        "train.global_batch = 8 does not divide by the 3 replicas"),
    "invalid config value": ({}, ["--set", "train.learning_rate=-0.1"], "train.learning_rate = -0.1 is not allowed"),
    "missing model": ({}, ["--set", 'model.checkpoint="/nonexistent/model"'], "is not a directory"),
    "unknown backend": ({}, ["--backend", "mxnet"], "backend 'mxnet' is not known"),
    "backend not installed": ({}, ["--backend", "jax"], "pip install ./packages/jax_backend"),
}
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_clear_line_and_leaves_nothing_behind(case, write_config, broken_mrpc, tmp_path,
                                                               capsys) -> None:
    fields, extra, fragment = CASES[case]
    if case == "backend not installed" and "jax" in registry.available():
        pytest.skip("the jax backend is installed in this environment")
    defect = fields.get("data__data_dir", "/")
    if not defect.startswith("/"):  # the name of a defect, not a path
        fields = {"data__data_dir": str(broken_mrpc(defect))}
    path = write_config(**fields)
    argv = ["train", str(path), *extra]
    code = cli.main(argv if "--backend" in extra else [*argv, "--backend", "numpy"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("tpuplex: error: ") and fragment in err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_a_bad_eval_split_leaves_no_run_and_only_whole_cache_files(write_config, broken_mrpc, tmp_path,
                                                                   capsys) -> None:
    folder = broken_mrpc("bad dev label")
    assert cli.main(["train", str(write_config(data__data_dir=str(folder))), "--backend", "numpy"]) == 2
    assert "dev.tsv line 2: label '2' is not a mrpc label" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(cached) == 1 and cached[0].startswith("mrpc-train-")
    assert (tmp_path / "cache" / cached[0] / "manifest.json").is_file()  # a published prepared folder


def test_errors_from_the_real_command_have_no_traceback(write_config, tmp_path) -> None:
    done = run_module("train", str(write_config()), "--backend", "numpy", "--set", "runtime.cpu_devices=3",
                      cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("tpuplex: error: train.global_batch = 8 does not divide by the 3 replicas")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_real_mrpc_with_minilm_evaluates_every_dev_example_once(write_config, shared_glue, minilm_dir, tmp_path,
                                                                capsys) -> None:
    """The real files (byte-order-mark headers, GLUE quoting) and the real tokenizer through the whole pipeline."""
    path = write_config(model__checkpoint="minilm", data__data_dir=str(shared_glue / "MRPC"), data__max_length=128,
                        data__buckets=[64], train__global_batch=32, train__max_steps=2, runtime__keep_checkpoints=1)
    assert cli.main(["train", str(path), "--backend", "numpy"]) == 0, capsys.readouterr().err
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["eval"]["examples"] == 408  # MRPC dev.tsv (shared/glue/README.md), each example once
    assert results["train"]["examples"] == 2 * 32
    assert 0 <= results["metrics"]["dev"]["accuracy"] <= 1


def test_eval_predict_and_generate_default_to_the_backend_the_run_trained_on(write_config, tmp_path, monkeypatch,
                                                                           capsys) -> None:
    from tpuplex.commands import generate, workflow
    from tpuplex.errors import TpuplexError

    assert cli.main(["train", str(write_config(train__max_steps=2)), "--backend", "numpy"]) == 0
    run = tmp_path / "run"
    assert cli.main(["eval", str(run)]) == 0 and cli.main(["predict", str(run), "--split", "dev"]) == 0
    assert (run / "eval" / "step-00000002-numpy.json").is_file()
    assert (run / "predictions" / "step-00000002-numpy").is_dir()
    def restore(found, name, model_only):
        raise TpuplexError(f"restored on {name}")

    # an MRPC run: only the backend matters here
    monkeypatch.setattr(generate, "check_run", lambda found, beams=1: None)
    monkeypatch.setattr(workflow, "restore", restore)
    capsys.readouterr()
    assert cli.main(["generate", str(run), "--prompt", "ROMEO:"]) == 2
    assert "restored on numpy" in capsys.readouterr().err

    (run / "log.jsonl").write_text("")
    assert cli.main(["eval", str(run)]) == 2
    assert "names no backend the run trained on: give one (--backend" in capsys.readouterr().err


def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "tpuplex"
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0 and done.stdout.strip().startswith("tpuplex ")


def test_an_unexpected_exception_is_one_line_and_a_traceback_file(monkeypatch, capsys) -> None:
    def broken_devices(args):
        raise KeyError("surprise")

    monkeypatch.setattr(cli, "_devices", broken_devices)
    assert cli.main(["devices"]) == cli.INTERNAL_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tpuplex: error: unexpected KeyError: 'surprise' (a tpuplex bug")
    path = Path(err.split("full traceback is in ")[1].split(";")[0])
    assert "Traceback" in path.read_text() and "broken_devices" in path.read_text()
    path.unlink()



def test_fitted_buckets_are_used_and_recorded(write_config, tmp_path) -> None:
    path = write_config(data__buckets=[], data__bucket_count=2)
    done = run_module("train", str(path), "--backend", "numpy", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    fitted, max_length = results["buckets"][:-1], results["buckets"][-1]
    assert 1 <= len(fitted) <= 2 and max_length == 32 and fitted == sorted(fitted)
    assert results["compile_count"] <= 2 * 3


def test_a_run_logged_to_a_file_prints_a_plain_progress_line_every_log_every_steps(write_config, tmp_path) -> None:
    """With stderr a file (a batch job's log) the progress bar is off; each `runtime.log_every` window is a line."""
    done = run_module("train", str(write_config()), "--backend", "numpy", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith("step ") and " ex/s" in line]
    steps = json.loads((tmp_path / "run" / "results.json").read_text())["total_steps"]
    assert [line.split()[1] for line in progress] == [f"{step}/{steps}" for step in range(2, steps + 1, 2)]
    # MFU is left out of a window that beat the CPU's peak as measured under another load (`flops.rates`).
    pattern = (r"\(\d+%\) loss \d+\.\d{4} \(mean of 2 steps\) lr \d\.\d\de[-+]\d\d \d+\.\d ex/s [\d.e-]+ TFLOP/s"
               r"( MFU \d+\.\d%)? eta")
    assert all(re.search(pattern, line) for line in progress), progress
    assert "eta 0:00:00" in progress[-1]


def test_the_live_bar_says_its_loss_is_the_last_step_s(tmp_path) -> None:
    """The bar's loss is one step's; the log's (run.history()'s, the plain lines') a window's mean: each is named."""
    import io

    from rich.console import Console

    from tpuplex.engine.run_log import Reporter

    shown = io.StringIO()
    with Reporter(tmp_path, console=Console(file=shown, force_terminal=True, width=160)) as reporter:
        reporter.start_progress(10, 0)
        reporter.advance(1, 0.5, 10.0)
    assert "last-step loss 0.5000" in shown.getvalue()


def test_the_help_names_every_built_in_task() -> None:
    from tpuplex.tasks import BUILTIN

    description = cli._parser().description  # what `tpuplex --help` prints first
    assert set(BUILTIN) <= set(re.findall(r"\w+", description)), description

"""eval, predict, export, sweep and report on the numpy backend: what each writes, and one line for bad input.
Cross-framework checks (torch -> jax/tf eval, the HF folder in transformers, the SavedModel) are in
tests/portable/test_workflow.py."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file
from test_cli import run_module
from tiny_glue import mrpc_rows, write_tiny_model_reading

import tpuplex
from tpuplex import config as config_lib
from tpuplex.commands import cli, export, run, run_folder, sweep
from tpuplex.errors import TpuplexError

TEST_HEADER = "index\t#1 ID\t#2 ID\t#1 String\t#2 String"


@pytest.fixture
def trained(write_config, tmp_path) -> Path:
    """A finished numpy run on tiny MRPC (with a test.tsv of 23 rows beside it); returns its run folder."""
    config = write_config(runtime__checkpoint_every=6, train__max_steps=12)
    assert cli.main(["train", str(config), "--backend", "numpy"]) == 0
    return tmp_path / "run"


@pytest.fixture
def with_test_file(tiny_mrpc, tmp_path) -> Path:
    """A copy of tiny MRPC with an unlabelled test.tsv (23 rows) in GLUE's test format."""
    folder = tmp_path / "MRPC-with-test"
    folder.mkdir()
    for name in ("train.tsv", "dev.tsv"):
        (folder / name).write_bytes((tiny_mrpc / name).read_bytes())
    rows = [f"{i}\t{row.split(chr(9), 1)[1]}" for i, row in enumerate(mrpc_rows(23, seed=5))]
    (folder / "test.tsv").write_text("\n".join([TEST_HEADER, *rows]) + "\n")
    return folder


def test_train_records_the_config_that_eval_reads(trained) -> None:
    found = run_folder.locate(trained)
    results = json.loads((trained / "results.json").read_text())
    assert found.checkpoint == trained / "checkpoints" / "step-00000012"
    assert found.config_hash == results["config_hash"]
    assert run_folder.locate(trained / "checkpoints" / "step-00000006").checkpoint.name == "step-00000006"


def test_eval_of_the_final_checkpoint_gives_the_training_run_s_metrics(trained, capsys) -> None:
    assert cli.main(["eval", str(trained), "--backend", "numpy"]) == 0
    written = json.loads((trained / "eval" / "step-00000012-numpy.json").read_text())
    expected = json.loads((trained / "results.json").read_text())["metrics"]
    assert written["examples"] == {"dev": 37}
    for name, value in expected["dev"].items():
        assert written["metrics"]["dev"][name] == pytest.approx(value, abs=1e-6)
    assert f"dev: accuracy {expected['dev']['accuracy']:.6f}" in capsys.readouterr().out


def test_a_sharded_run_evaluates_on_the_devices_there_are(trained, capsys) -> None:
    """A run trained on `runtime.mesh = {fsdp = 2}` over CPU devices (its run.json says so) evaluates where that
    layout does not fit (here a backend that keeps parameters whole): on the devices there are, said in one line;
    training on that layout is still refused."""
    recorded = json.loads((trained / "run.json").read_text())
    recorded["config"]["runtime"].update(mesh={"fsdp": 2}, cpu_devices=2)
    (trained / "run.json").write_text(json.dumps(recorded))
    expected = json.loads((trained / "results.json").read_text())["metrics"]["dev"]["accuracy"]
    assert cli.main(["eval", str(trained), "--backend", "numpy"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("tpuplex: runtime.mesh = {'fsdp': 2} splits parameters, which the numpy "
                                     "backend keeps whole; the checkpoint is read on the 1 cpu device(s) of the numpy "
                                     "backend instead") in err
    assert tpuplex.Run.open(trained).evaluate(backend="numpy")["metrics"]["dev"]["accuracy"] == pytest.approx(expected)
    with pytest.raises(TpuplexError, match="splits parameters over fsdp or tensor"):
        run.prepare(config_lib.from_dict(recorded["config"]), "numpy")


def test_predict_writes_the_glue_submission_file(trained, with_test_file) -> None:
    assert cli.main(["predict", str(trained), "--backend", "numpy", "--data-dir", str(with_test_file)]) == 0
    path = trained / "predictions" / "step-00000012-numpy" / "MRPC.tsv"
    lines = path.read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 1 + 23
    assert [line.split("\t")[0] for line in lines[1:]] == [str(i) for i in range(23)]
    assert {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}


def test_predict_on_dev_matches_eval_accuracy(trained, tiny_mrpc, tmp_path) -> None:
    out = tmp_path / "dev-predictions"
    assert cli.main(["predict", str(trained), "--backend", "numpy", "--split", "dev", "--out", str(out)]) == 0
    predicted = np.array([int(line.split("\t")[1]) for line in (out / "dev.tsv").read_text().splitlines()[1:]])
    labels = np.array([int(line.split("\t")[0]) for line in (tiny_mrpc / "dev.tsv").read_text().splitlines()[1:]])
    accuracy = json.loads((trained / "results.json").read_text())["metrics"]["dev"]["accuracy"]
    assert np.mean(predicted == labels) == pytest.approx(accuracy)


def test_predict_never_replaces_a_file_it_did_not_write(trained, tiny_mrpc, tmp_path, capsys) -> None:
    data = tmp_path / "MRPC"  # the data folder the run read, given as --out: its own dev.tsv is in the way
    data.mkdir()
    (data / "dev.tsv").write_bytes((tiny_mrpc / "dev.tsv").read_bytes())
    capsys.readouterr()
    assert cli.main(["predict", str(trained), "--backend", "numpy", "--split", "dev", "--out", str(data)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("tpuplex: error: --out ") and "holds files tpuplex did not write (dev.tsv)" in error
    assert (data / "dev.tsv").read_bytes() == (tiny_mrpc / "dev.tsv").read_bytes()
    assert sorted(child.name for child in data.iterdir()) == ["dev.tsv"]
    out = tmp_path / "predictions"
    for _ in range(2):  # a folder predict wrote may be written again
        assert cli.main(["predict", str(trained), "--backend", "numpy", "--split", "dev", "--out", str(out)]) == 0
    assert sorted(child.name for child in out.iterdir()) == [".tpuplex-predictions", "dev.tsv"]


def test_export_hf_writes_config_weights_and_tokenizer(trained, tiny_model) -> None:
    assert cli.main(["export", str(trained), "--format", "hf"]) == 0
    folder = trained / "export" / "step-00000012-hf"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "0", "1": "1"} and config["label2id"] == {"0": 0, "1": 1}
    assert config["problem_type"] == "single_label_classification"
    assert config["hidden_size"] == json.loads((tiny_model / "config.json").read_text())["hidden_size"]
    with safe_open(folder / "model.safetensors", "np") as weights:
        assert weights.metadata() == {"format": "pt"}
    exported = load_file(folder / "model.safetensors")
    trained_weights = load_file(trained / "checkpoints" / "step-00000012" / "model.safetensors")
    assert exported.keys() == trained_weights.keys() and "classifier.weight" in exported
    assert all(np.array_equal(exported[name], trained_weights[name]) for name in exported)
    assert {"tokenizer.json", "vocab.txt"} <= {p.name for p in folder.iterdir()}


def test_report_writes_a_table_row_per_run_and_a_png(trained, tmp_path) -> None:
    out = tmp_path / "report"
    assert cli.main(["report", str(trained), str(trained / "results.json"), "--out", str(out)]) == 0
    rows = (out / "report.md").read_text().splitlines()
    assert rows[0].startswith("| run | dataset | backend | seed |") and len(rows) == 2 + 2
    assert rows[2].startswith("| run | mrpc | numpy | 7 | 12 | dev accuracy ")
    png = (out / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (1100, 400)  # figsize 11 x 4 inches at 100 dpi


def test_sweep_runs_every_seed_and_reports_mean_and_std(write_config, tmp_path, capsys) -> None:
    config = write_config(train__max_steps=4)
    assert cli.main(["sweep", str(config), "--backend", "numpy", "--seeds", "1,2,3"]) == 0
    summary = json.loads((tmp_path / "run" / "sweep.json").read_text())
    accuracies = [json.loads((tmp_path / "run" / f"seed-{s}" / "results.json").read_text())["metrics"]["dev"]
                  ["accuracy"] for s in (1, 2, 3)]
    assert summary["seeds"] == [1, 2, 3]
    assert summary["metrics"]["dev accuracy"]["values"] == accuracies
    assert summary["metrics"]["dev accuracy"]["mean"] == pytest.approx(np.mean(accuracies))
    assert summary["metrics"]["dev accuracy"]["std"] == pytest.approx(np.std(accuracies, ddof=1))
    table = (tmp_path / "run" / "sweep.md").read_text()
    assert "| dev accuracy |" in table and table in capsys.readouterr().out + "\n"


def test_an_interrupted_sweep_keeps_its_finished_seeds(write_config, tmp_path) -> None:
    config = write_config(train__max_steps=4)
    assert cli.main(["sweep", str(config), "--backend", "numpy", "--seeds", "1"]) == 0
    first = (tmp_path / "run" / "seed-1" / "results.json").stat().st_mtime_ns
    assert cli.main(["sweep", str(config), "--backend", "numpy", "--seeds", "1,2"]) == 0
    assert (tmp_path / "run" / "seed-1" / "results.json").stat().st_mtime_ns == first
    assert json.loads((tmp_path / "run" / "sweep.json").read_text())["seeds"] == [1, 2]


@pytest.mark.parametrize(("args", "message"), [
    (["eval", "{empty}", "--backend", "numpy"], "holds no checkpoint"),
    (["eval", "{missing}", "--backend", "numpy"], "does not exist: give a run folder"),
    (["eval", "{config}", "--backend", "numpy"], "config.toml is a file: give a run folder"),
    (["predict", "{run}", "--backend", "numpy", "--split", "dev", "--out", "{config}"],
     "is a file: give a folder for the prediction files"),
    (["eval", "{run}", "--backend", "numpy", "--split", "test"], "has no evaluation split 'test'"),
    (["predict", "{run}", "--backend", "numpy", "--split", "dev_matched"], "has no split 'dev_matched'"),
    (["predict", "{run}", "--backend", "numpy"], "test.tsv does not exist"),
    (["export", "{run}", "--format", "onnx"],
     "unknown export format 'onnx': use one of hf, peft, saved_model, torch_export"),
    (["sweep", "{config}", "--backend", "numpy", "--seeds", "1,x"], "is not a comma-separated list of integers"),
    (["report", "{empty}"], "has no results.json"),
])
def test_bad_input_is_one_line_and_writes_nothing(trained, args, message, tmp_path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "config.toml").write_text("[train]\nseed = 1\n")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    names = {"empty": empty, "missing": tmp_path / "missing", "run": trained, "config": tmp_path / "config.toml"}
    done = run_module(*(arg.format(**names) for arg in args), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpuplex: error: ") and message in lines[0], done.stderr
    after = sorted(str(p) for p in tmp_path.rglob("*") if "/cache/" not in str(p))
    assert after == [p for p in before if "/cache/" not in p]


def test_fp8_off_the_torch_backend_is_one_line_before_any_data_is_read(write_config, tmp_path, capsys) -> None:
    config = write_config(train__fp8=True)
    assert cli.main(["train", str(config), "--backend", "numpy"]) == 2
    assert "train.fp8 (torchao's float8 training) runs on the torch backend, not numpy" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_export_refuses_an_existing_folder(trained) -> None:
    out = trained / "taken"
    out.mkdir()
    with pytest.raises(TpuplexError, match="already exists"):
        export.export(trained, "hf", out)


def test_bad_seeds() -> None:
    with pytest.raises(TpuplexError, match="each once"):
        sweep.parse_seeds("1,1")


@pytest.mark.parametrize(("task", "rows", "labels"), [
    ("MRPC", 1725, {"0", "1"}), ("RTE", 3000, {"entailment", "not_entailment"}), ("SST-2", 1821, {"0", "1"}),
    ("WNLI", 146, {"0", "1"})])
def test_predict_writes_submission_files_for_the_real_test_sets(task, rows, labels, shared_glue, minilm_dir,
                                                                tmp_path) -> None:
    model = write_tiny_model_reading(tmp_path / "model", minilm_dir)
    config = tmp_path / "config.toml"
    config.write_text(f'[model]\ncheckpoint = "{model}"\n[data]\ndataset = "{task}"\n'
                      f'data_dir = "{shared_glue / task}"\n'
                      f'max_length = 64\ncache_dir = "{tmp_path / "cache"}"\n[train]\nmax_steps = 1\n'
                      f'global_batch = 8\n[runtime]\noutput_dir = "{tmp_path / "run"}"\n')
    assert cli.main(["train", str(config), "--backend", "numpy"]) == 0
    assert cli.main(["predict", str(tmp_path / "run"), "--backend", "numpy", "--out", str(tmp_path / "out")]) == 0
    lines = (tmp_path / "out" / f"{task}.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 1 + rows
    assert [line.split("\t")[0] for line in lines[1:]] == [str(i) for i in range(rows)]
    assert {line.split("\t")[1] for line in lines[1:]} <= labels


MINE = b"my own file: not tpuplex's\n"


@pytest.mark.parametrize("command", ["train", "report", "sweep", "export", "prepare"])
def test_no_command_replaces_a_file_it_did_not_write(command, trained, write_config, tiny_model, tmp_path,
                                                     capsys) -> None:
    """Each writing command, pointed at a file of the user's, refuses in one line and leaves it byte-identical
    (predict: test_predict_never_replaces_a_file_it_did_not_write)."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    mine, arguments = {
        "train": ("results.json", ["train", str(write_config(runtime__output_dir=str(theirs))), "--backend", "numpy"]),
        "report": ("report.md", ["report", str(trained), "--out", str(theirs)]),
        "sweep": ("sweep.md", ["sweep", str(write_config(runtime__output_dir=str(theirs))), "--backend", "numpy",
                               "--seeds", "1"]),
        "export": ("config.json", ["export", str(trained), "--format", "hf", "--out", str(theirs)]),
        "prepare": ("train.txt", ["prepare", str(tmp_path / "corpus.txt"), "--out", str(theirs), "--tokenizer",
                                  str(tiny_model), "--max-length", "8"]),
    }[command]
    (tmp_path / "corpus.txt").write_text("a b c d e f g h i j k l m n o p\n" * 4)
    (theirs / mine).write_bytes(MINE)
    capsys.readouterr()
    assert cli.main(arguments) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tpuplex:")]
    assert len(errors) == 1 and errors[0].startswith("tpuplex: error: ") and str(theirs) in errors[0], errors
    assert sorted(child.name for child in theirs.iterdir()) == [mine] and (theirs / mine).read_bytes() == MINE


def test_a_report_folder_a_report_wrote_may_be_written_again(trained, tmp_path) -> None:
    for _ in range(2):
        assert cli.main(["report", str(trained), "--out", str(tmp_path / "report")]) == 0
    assert sorted(child.name for child in (tmp_path / "report").iterdir()) == ["report.md", "report.png"]


def test_bf16_on_the_numpy_backend_is_one_warning_line(write_config, capsys) -> None:
    config = write_config(train__bf16=True, train__max_steps=2)
    assert cli.main(["train", str(config), "--backend", "numpy"]) == 0
    assert capsys.readouterr().err.count("tpuplex: warning: train.bf16 = true computes in bfloat16") == 1


def test_outputs_take_the_permissions_the_umask_gives(write_config, with_test_file, tmp_path) -> None:
    """run.json, results.json, checkpoints, predictions and exports are written through hidden staging names, which
    `tempfile` makes private; they end with the mode any file the user creates gets (here umask 022)."""
    config = write_config(runtime__checkpoint_every=6, train__max_steps=6)
    previous = os.umask(0o022)
    try:
        assert cli.main(["train", str(config), "--backend", "numpy"]) == 0
        run = tmp_path / "run"
        assert cli.main(["predict", str(run), "--backend", "numpy", "--data-dir", str(with_test_file)]) == 0
        assert cli.main(["export", str(run), "--format", "hf"]) == 0
    finally:
        os.umask(previous)
    files = [path for path in run.rglob("*") if path.is_file()]
    folders = [run, *(path for path in run.rglob("*") if path.is_dir())]
    assert {run / "run.json", run / "results.json", run / "checkpoints" / "step-00000006" / "model.safetensors",
            run / "export" / "step-00000006-hf" / "model.safetensors"} <= set(files)
    assert {str(path.relative_to(run)): oct(path.stat().st_mode & 0o777) for path in files
            if path.stat().st_mode & 0o777 != 0o644} == {}
    assert {str(path.relative_to(run)): oct(path.stat().st_mode & 0o777) for path in folders
            if path.stat().st_mode & 0o777 != 0o755} == {}


@pytest.mark.parametrize("theirs", [{"run.json": '{"notes": "mine"}', "results.json": '{"accuracy": 0.9}'},
                                    {"log.jsonl": "my own log line\n"},
                                    {"run.json": "not json"},
                                    {"tensorboard/notes.txt": "mine"}])
def test_a_folder_of_yours_is_never_taken_for_a_run_s(write_config, tmp_path, capsys, theirs) -> None:
    """runtime.output_dir holding a run.json, results.json or log.jsonl tpuplex did not write: refused in one line,
    every file byte-identical afterwards."""
    folder = tmp_path / "mine"
    for name, text in theirs.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    before = {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}
    config = write_config(runtime__output_dir=str(folder))
    assert cli.main(["train", str(config), "--backend", "numpy"]) == 2
    assert "holds files tpuplex did not write" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()} == before


def test_a_run_folder_from_before_the_format_mark_still_resumes(write_config, tmp_path, capsys) -> None:
    config = write_config(train__max_steps=6, runtime__checkpoint_every=3)
    assert cli.main(["train", str(config), "--backend", "numpy"]) == 0
    run_file = tmp_path / "run" / "run.json"
    recorded = json.loads(run_file.read_text())
    assert recorded["format"] == run_folder.RUN_FORMAT
    before_the_mark = ("config", "directory", "task_options")  # what run.json held before `format`
    run_file.write_text(json.dumps({key: recorded[key] for key in before_the_mark}))
    assert cli.main(["train", str(config), "--backend", "numpy"]) == 0
    assert json.loads((tmp_path / "run" / "results.json").read_text())["resumed_from"].endswith("step-00000006")

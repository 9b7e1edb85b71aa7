"""`tpuplex tune` (docs/tune.md) on the numpy backend: Optuna's search over ordinary run folders.

- One worker on the embedded SQLite storage: 6 trials, tune.json / tune.md / best.toml, and best.toml trains to the
  reported metric exactly; the same command again adds nothing; a study made for another space is refused.
- Three worker processes against a real PostgreSQL server (started here, on loopback, in a temporary folder):
  exactly N trials in all, none run twice, at least one pruned by the median pruner, and one worker SIGKILLed in
  the middle of a trial whose retry resumes that trial's run folder from its checkpoint.
- The median pruner on a real search (one worker, SQLite): a hopeless trial stops at an evaluation, PRUNED in the
  study and tune.json, its run folder no further than that step.
- Bad input is one line and exit 2 before any trial: the space, the metric (known from the config through each
  task's `metric_names`, which say what their evaluations report), the storage.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

import tpuplex
from tpuplex import tasks
from tpuplex.commands import cli
from tpuplex.config import Config

optuna = pytest.importorskip("optuna")  # the core's [tune] extra; nox's tests-core installs it

SPACE = '"train.learning_rate" = {log_uniform = [1e-3, 10.0]}\n"train.warmup_ratio" = {uniform = [0.0, 0.3]}\n'
"""On the tiny numpy run the dev loss spreads from ~0.69 (small rates) to ~1+ (large ones): the median pruner
has something to prune."""
TIMEOUT_S = 120
"""A generous bound on every wait for a state (a loaded 2-core machine is slow, not wrong)."""


def tune_config(write_config, tmp_path: Path, **tune_fields) -> Path:
    """The tiny MRPC run (24 steps, evaluated and checkpointed every 4) with a [tune] table over SPACE."""
    path = write_config(runtime__eval_every=4, runtime__checkpoint_every=4, runtime__output_dir=str(tmp_path / "tune"))
    fields = {"metric": "dev.loss", "trials": 6, "pruner_startup_trials": 2, "plots": False, **tune_fields}
    table = "".join(f"{name} = {json.dumps(value)}\n" for name, value in fields.items())
    path.write_text(path.read_text() + f"\n[tune]\n{table}\n[tune.space]\n{SPACE}")
    return path


def cli_error(argv: list[str], capsys) -> str:
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("tpuplex: error: ")
    return lines[-1].removeprefix("tpuplex: error: ")


# -- one worker, the embedded storage ---------------------------------------------------------------------------


def test_six_trials_on_sqlite_and_best_toml_trains_to_the_reported_metric(write_config, tmp_path, capsys) -> None:
    config = tune_config(write_config, tmp_path, plots=True)
    tuned = tpuplex.tune(config, "numpy")
    out = capsys.readouterr().out
    folder = tmp_path / "tune"
    assert tuned.folder == folder and (folder / "study.db").is_file()
    if importlib.util.find_spec("matplotlib") is not None:  # optional: the plots need matplotlib
        assert all((folder / name).stat().st_size > 0 for name in ("history.png", "importances.png", "parallel.png"))
    assert len([line for line in out.splitlines() if line.startswith("tune: trial ")]) == 6  # a line per trial

    summary = json.loads((folder / "tune.json").read_text())
    assert summary == tuned.summary and len(summary["trials"]) == 6
    assert [row["trial"] for row in summary["trials"]] == list(range(6))
    for row in summary["trials"]:
        assert row["state"] in ("complete", "pruned") and row["attempts"] == [row["trial"]]
        assert row["steps"] == 24 if row["state"] == "complete" else 0 < row["steps"] < 24
        trial = folder / f"trial-{row['trial']}"  # an ordinary run folder, with the trial's values
        recorded = json.loads((trial / "run.json").read_text())["config"]
        assert recorded["train"]["learning_rate"] == row["params"]["train.learning_rate"]
        assert tpuplex.Run.open(trial).history("eval")[-1]["loss"] == row["value"]
    markdown = (folder / "tune.md").read_text()
    assert markdown.count("\n| ") == 7 and "(best)" in markdown

    best = summary["best"]
    complete = [row for row in summary["trials"] if row["state"] == "complete"]
    assert best["value"] == min(row["value"] for row in complete)
    text = (folder / "best.toml").read_text()
    assert "tune" not in tomllib.loads(text) and best["value"] == tuned.best["value"]
    assert cli.main(["train", str(folder / "best.toml"), "--backend", "numpy"]) == 0
    results = json.loads((folder / "best" / "results.json").read_text())
    assert results["metrics"]["dev"]["loss"] == best["value"]  # exactly: the same run, anew
    assert results["config"]["train"]["learning_rate"] == best["params"]["train.learning_rate"]
    trial_results = json.loads((folder / f"trial-{best['trial']}" / "results.json").read_text())
    assert results["config_hash"] == trial_results["config_hash"]

    # The same command again: the study has its 6 trials, so nothing runs and nothing changes.
    again = tpuplex.tune(config, "numpy")
    assert again.summary == summary and "tune: trial " not in capsys.readouterr().out

    # Another space against that study is refused, in one line.
    other = tune_config(write_config, tmp_path)
    other.write_text(other.read_text().replace("log_uniform = [1e-3, 10.0]", "log_uniform = [1e-4, 1.0]"))
    message = cli_error(["tune", str(other), "--backend", "numpy"], capsys)
    assert message.startswith("study 'tune' in sqlite:///") and "was created with another space" in message


def test_the_median_pruner_stops_a_hopeless_trial_after_an_evaluation(write_config, tmp_path, capsys) -> None:
    """A real search in which the median pruner prunes: learning rates from sensible to absurd (SPACE), six
    evaluations a trial, the default sampler. A pruned trial is PRUNED in the study and in tune.json, was worse than
    the median of the complete trials at that evaluation, and its run folder stopped there."""
    config = tune_config(write_config, tmp_path, trials=6, pruner_startup_trials=2)
    tuned = tpuplex.tune(config, "numpy")
    out = capsys.readouterr().out
    rows = tuned.trials
    pruned = [row for row in rows if row["state"] == "pruned"]
    complete = [row for row in rows if row["state"] == "complete"]
    assert pruned and len(complete) >= 2 and len(pruned) + len(complete) == 6, rows
    assert tuned.summary["counts"]["pruned"] == len(pruned)
    study = optuna.load_study(study_name="tune", storage=f"sqlite:///{tmp_path / 'tune' / 'study.db'}")
    states = {trial.number: trial.state.name for trial in study.get_trials()}
    evaluations = {row["trial"]: {record["step"]: record["loss"] for record in tpuplex.Run.open(row["folder"])
                                  .history("eval")} for row in rows}
    for row in complete:
        assert states[row["trial"]] == "COMPLETE" and row["steps"] == 24 and max(evaluations[row["trial"]]) == 24
    for row in pruned:
        number, step, folder = row["trial"], row["steps"], Path(row["folder"])
        assert states[number] == "PRUNED"
        assert f"tune: trial {number} pruned: dev.loss {row['value']:.6g} at step {step}," in out
        records = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
        assert records[0]["event"] == "start" and records[0]["total_steps"] == 24
        assert 0 < step < 24 and max(record["step"] for record in records) == step  # no step trained past it
        assert max(evaluations[number]) == step and evaluations[number][step] == row["value"]
        assert not (folder / "results.json").exists()  # the run did not finish
        # Optuna's median rule: its best value so far is worse than the median of the trials complete before it at
        # that step.
        before = [evaluations[other["trial"]][step] for other in complete if other["trial"] < number]
        assert len(before) >= 2 and min(evaluations[number].values()) > float(np.median(before))
    markdown = (tmp_path / "tune" / "tune.md").read_text()
    assert f"({len(complete)} complete, {len(pruned)} pruned)" in markdown


# -- bad input -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "message"), [
    (("log_uniform = [1e-3, 10.0]", "log_uniform = [0.0, 10.0]"), "a log scale needs low > 0"),
    (('"train.learning_rate"', '"train.lr"'), "tune.space 'train.lr': unknown config field train.lr: [train] has"),
    (('"train.learning_rate" = {log_uniform = [1e-3, 10.0]}', '"train.epochs" = {uniform = [1.0, 3.0]}'),
     "train.epochs is an integer field: use {int = [a, b]} or {choice = [...]}, not uniform"),
    (('"train.learning_rate" = {log_uniform = [1e-3, 10.0]}', '"data.group_by_length" = {int = [0, 1]}'),
     "data.group_by_length takes true or false: use {choice = [...]}, not int"),
    (('"train.learning_rate" = {log_uniform = [1e-3, 10.0]}', '"train.schedule" = {choice = ["linear", "step"]}'),
     "the value 'step' is refused: train.schedule = 'step' is not allowed"),
    (('"train.learning_rate" = {log_uniform = [1e-3, 10.0]}', '"runtime.output_dir" = {choice = ["a", "b"]}'),
     "changes where or how often a run writes"),
    (('metric = "dev.loss"', 'metric = "dev.loss"\nsampler = "anneal"'), "tune.sampler = 'anneal' is not allowed"),
    (('metric = "dev.loss"', 'metric = "dev.loss"\nepochs = 3'), "unknown field tune.epochs: [tune] has metric"),
    (('metric = "dev.loss"', 'metric = "loss"'), "tune.metric = 'loss' is not allowed: use <eval split>.<metric>"),
])
def test_a_bad_search_is_one_line_before_anything_is_written(write_config, tmp_path, capsys, change,
                                                             message) -> None:
    config = tune_config(write_config, tmp_path)
    text = config.read_text()
    assert change[0] in text
    config.write_text(text.replace(change[0], change[1], 1))
    assert message in cli_error(["tune", str(config), "--backend", "numpy"], capsys)
    assert not (tmp_path / "tune").exists()


@pytest.mark.parametrize(("metric", "space", "message"), [
    ("dev.mcc", "", "tune.metric = 'dev.mcc' is not reported by the sequence_classification task: its evaluations "
     "report dev.accuracy, dev.f1, dev.score, dev.loss: name one of them"),
    ("validation.accuracy", "", "tune.metric = 'validation.accuracy' names no evaluation split of the run: its "
     "evaluation splits are dev: use e.g. 'dev.accuracy'"),
    ("dev.f1", '"data.dataset" = {choice = ["mrpc", "cola"]}\n',
     "tune.metric = 'dev.f1' is not reported by the sequence_classification task with data.dataset = 'cola': its "
     "evaluations report dev.mcc, dev.score, dev.loss: name one of them"),
])
def test_a_metric_the_task_does_not_report_is_one_line_before_any_study(write_config, tmp_path, capsys, monkeypatch,
                                                                        metric, space, message) -> None:
    """Known from the config (`Task.metric_names`): refused before the study or any trial exists."""
    from tpuplex.commands import run as run_lib

    def no_trial(*args, **kwargs):
        raise AssertionError("a trial ran")

    monkeypatch.setattr(run_lib, "train", no_trial)
    config = tune_config(write_config, tmp_path, metric=metric)
    text = config.read_text()
    config.write_text(text + space)
    assert cli_error(["tune", str(config), "--backend", "numpy"], capsys) == message
    assert not (tmp_path / "tune").exists()  # no study, no trial folder, no tune.json
    monkeypatch.undo()
    # Fixed, the same folder is a new search; what the trial's evaluations report is what metric_names said.
    config.write_text(text.replace(f'"{metric}"', '"dev.accuracy"').replace("trials = 6", "trials = 1"))
    assert cli.main(["tune", str(config), "--backend", "numpy"]) == 0
    summary = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert [row["state"] for row in summary["trials"]] == ["complete"] and summary["metric"] == "dev.accuracy"
    results = json.loads((tmp_path / "tune" / "trial-0" / "results.json").read_text())
    task = tasks.get("sequence_classification")
    said = task.metric_names(Config.from_dict(results["config"]), tasks.options(task, {}))
    assert {split: sorted(names) for split, names in said.items()} == {"dev": sorted(results["metrics"]["dev"])}


TOKENS = ("loss", "perplexity", "accuracy")
SEQ2SEQ = ("loss", "token_accuracy", "exact_match")
PER_TYPE = ("*/precision", "*/recall", "*/f1", "*/support")
ENTITIES = ("precision", "recall", "f1", "accuracy", "loss", "cut_words", *PER_TYPE)


@pytest.mark.parametrize(("task", "data", "options", "expected"), [
    ("sequence_classification", {"dataset": "mnli"}, {},
     {"dev_matched": ("accuracy", "score", "loss"), "dev_mismatched": ("accuracy", "score", "loss")}),
    ("sequence_classification", {"dataset": "own", "train_file": "train.csv", "eval_files": ["held/dev.csv"]},
     {"text_columns": ["text"], "labels": ["a", "b"], "metrics": ["mcc", "f1"]},
     {"dev": ("mcc", "f1", "score", "loss")}),
    ("causal_lm", {"train_file": "input.txt"}, {"tokenizer": "characters"}, {"validation": TOKENS}),
    ("causal_lm", {"train_file": "input.txt", "eval_files": ["held/dev.txt", "test.csv"]}, {},
     {"dev": TOKENS, "test": TOKENS}),
    ("causal_lm", {"train_file": "train.csv", "eval_files": ["held/dev.csv"]},
     {"prompt_template": "{{ text }}", "answer_template": "{{ label }}"}, {"dev": (*TOKENS, "answer_accuracy")}),
    ("masked_lm", {"train_file": "input.txt"}, {}, {"validation": TOKENS}),
    ("span_corruption", {"train_file": "input.txt", "eval_files": ["held/dev.txt"]}, {}, {"dev": TOKENS}),
    ("seq2seq", {"dataset": "cola"}, {}, {"dev": (*SEQ2SEQ, "mcc", "score")}),
    ("seq2seq", {"train_file": "train.csv", "eval_files": ["held/dev.csv"]},
     {"input_template": "{{ text }}", "target_template": "{{ label }}"}, {"dev": SEQ2SEQ}),
    ("token_classification", {"train_file": "train.conll", "eval_files": ["held/devel.conll"],
                              "test_file": "test.conll"}, {}, {"devel": ENTITIES}),
    ("image_classification", {"train_file": "images", "eval_files": ["held/val"]}, {}, {"val": ("accuracy", "loss")}),
    ("image_classification", {"train_file": "images"}, {}, {"validation": ("accuracy", "loss")}),
    ("speech_recognition", {"train_file": "train.tsv", "eval_files": ["held/dev.tsv"]}, {},
     {"dev": ("wer", "cer", "loss")}),
])
def test_each_builtin_task_names_the_metrics_its_evaluations_report(tmp_path, monkeypatch, task, data, options,
                                                                    expected) -> None:
    """`Task.metric_names` from the config alone (files looked up, never read): each evaluation split, named as the
    task's `prepare` names it, and the names its `TaskData.metrics` returns."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "held").mkdir()
    for spec in (data.get("train_file"), *data.get("eval_files", ()), data.get("test_file")):
        if spec and "." in Path(spec).name:
            (tmp_path / spec).write_text("text,label\nsome words,a\n")
    found = tasks.get(task)
    config = Config.from_dict({"task": {"name": task, **options}, "data": data})
    said = found.metric_names(config, tasks.options(found, config.task.options))
    assert {split: tuple(names) for split, names in said.items()} == expected


def test_the_metric_names_are_those_the_tasks_compute() -> None:
    """What `metric_names` says against the tasks' own metric functions, on a few made-up predictions."""
    import fnmatch
    from types import SimpleNamespace

    from tpuplex.tasks.base import token_metrics
    from tpuplex.tasks.image_classification import ImageData
    from tpuplex.tasks.seq2seq import Seq2SeqData
    from tpuplex.tasks.token_classification.entities import scores

    outputs, weight = np.zeros((2, 3, 2), np.float32), np.ones((2, 3), np.float32)
    assert tuple(token_metrics(outputs, weight)) == TOKENS
    assert tuple(Seq2SeqData.metrics(SimpleNamespace(classes=None), "dev", outputs, np.zeros((2, 3)), weight)) == (
        SEQ2SEQ)
    logits = np.zeros((2, 3), np.float32)
    assert sorted(ImageData.metrics(None, "dev", logits, np.zeros(2, np.int64), np.ones(2))) == ["accuracy", "loss"]
    found = [*scores([["B-PER", "O", "B-LOC"]], [["B-PER", "B-ORG", "O"]]), "loss", "cut_words"]
    assert "PER/f1" in found and "ORG/precision" in found
    assert all(any(fnmatch.fnmatchcase(name, pattern) for pattern in ENTITIES) for name in found)
    assert set(ENTITIES) - set(PER_TYPE) <= set(found)


def test_a_storage_that_cannot_be_reached_is_one_line_and_makes_nothing(write_config, tmp_path, capsys) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://tpuplex:secret@127.0.0.1:{port}/tune"
    message = cli_error(["tune", str(tune_config(write_config, tmp_path)), "--backend", "numpy", "--storage", url],
                        capsys)
    assert message.startswith(f"--storage postgresql+psycopg://tpuplex:***@127.0.0.1:{port}/tune cannot be reached")
    assert "secret" not in message and not (tmp_path / "tune").exists()


# -- many workers, PostgreSQL -------------------------------------------------------------------------------------

_WORKER = """
import os, sys, time
from tpuplex.commands.cli import main
from tpuplex.testing.numpy_backend import NumpyBackend

hold, step_seconds = sys.argv[1], float(sys.argv[2])
train_step = NumpyBackend.train_step

def slow_train_step(self, state, batch, learning_rate):
    if state.step == 5:  # about to train step 6: one worker, once in the study, holds here until it is killed
        try:
            marker = os.open(hold, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(marker, str(os.getpid()).encode())
            os.close(marker)
            while True:
                time.sleep(0.05)
    time.sleep(step_seconds)  # a trial long enough for three workers to overlap
    return train_step(self, state, batch, learning_rate)

NumpyBackend.train_step = slow_train_step
sys.exit(main(sys.argv[3:]))
"""


@pytest.fixture(scope="module")
def postgres_url() -> str:
    """A PostgreSQL server of its own on loopback, in a temporary folder, for this module: started as the user
    `nobody` when the tests run as root (postgres refuses root). Fails, rather than skips, where
    TPUPLEX_REQUIRE_SHARED=1 (CI, which installs PostgreSQL: .ci/run)."""
    server = None
    try:
        server = _PostgresServer()
        yield server.url
    except _NoServer as missing:
        if os.environ.get("TPUPLEX_REQUIRE_SHARED") == "1":
            pytest.fail(f"{missing}; TPUPLEX_REQUIRE_SHARED=1 requires a PostgreSQL server", pytrace=False)
        pytest.skip(str(missing))
    finally:
        if server is not None:
            server.stop()


class _NoServer(Exception):
    pass


class _PostgresServer:
    def __init__(self) -> None:
        binaries = _postgres_binaries()
        self.folder = Path(tempfile.mkdtemp(prefix="tpuplex-postgres-"))
        self.process: subprocess.Popen | None = None
        as_user = None
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            as_user = (nobody.pw_uid, nobody.pw_gid)
            os.chown(self.folder, *as_user)

        def drop() -> None:
            if as_user is not None:
                os.setgroups([])
                os.setgid(as_user[1])
                os.setuid(as_user[0])

        data = self.folder / "data"
        done = subprocess.run([binaries / "initdb", "-D", data, "-A", "trust", "-U", "tpuplex", "-E", "UTF8",
                               "--no-sync"], capture_output=True, text=True, preexec_fn=drop, check=False,
                              timeout=TIMEOUT_S)
        if done.returncode != 0:
            self.stop()
            raise _NoServer(f"initdb failed: {done.stderr.strip()[-300:]}")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.log = open(self.folder / "server.log", "w")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [binaries / "postgres", "-D", data, "-p", str(port), "-k", self.folder, "-c", "listen_addresses=127.0.0.1",
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "max_connections=100"],
            stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=drop)
        self.url = f"postgresql+psycopg://tpuplex@127.0.0.1:{port}/postgres"
        import psycopg

        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                psycopg.connect(f"host=127.0.0.1 port={port} user=tpuplex dbname=postgres", connect_timeout=5).close()
                return
            except psycopg.OperationalError as error:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise _NoServer(f"postgres did not start ({error}): "
                                    f"{(self.folder / 'server.log').read_text()[-300:]}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # postgres' fast shutdown
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if getattr(self, "log", None) is not None:
            self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _postgres_binaries() -> Path:
    found = shutil.which("initdb")
    if found and (Path(found).resolve().parent / "postgres").exists():
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if not versions:
        raise _NoServer("PostgreSQL's initdb is not installed (apt-get install postgresql)")
    return Path(versions[-1]).parent


def test_three_workers_share_one_postgres_study_and_a_killed_trial_resumes(write_config, tmp_path,
                                                                            postgres_url) -> None:
    trials = 8
    config = tune_config(write_config, tmp_path, trials=trials, study="three-workers", heartbeat_interval=1,
                         grace_period=3)
    hold = tmp_path / "held"
    command = [sys.executable, "-c", _WORKER, str(hold), "0.04", "tune", str(config), "--backend", "numpy",
               "--storage", postgres_url]
    logs = [open(tmp_path / f"worker-{index}.log", "w") for index in range(3)]  # noqa: SIM115
    workers = [subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path) for log in logs]
    try:
        held = _poll(lambda: hold.is_file() and hold.read_text(), "a worker to hold a trial at step 6")
        by_pid = {worker.pid: worker for worker in workers}
        killed = by_pid[int(held)]
        killed.send_signal(signal.SIGKILL)
        assert killed.wait(timeout=TIMEOUT_S) == -signal.SIGKILL
        for worker in workers:
            if worker is not killed:
                assert worker.wait(timeout=TIMEOUT_S) == 0, _tail(tmp_path)
    finally:
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                worker.kill()
            worker.wait()
        for log in logs:
            log.close()

    summary = json.loads((tmp_path / "tune" / "tune.json").read_text())
    rows = summary["trials"]
    assert len(rows) == trials and len({row["trial"] for row in rows}) == trials  # exactly N, each once
    assert {row["state"] for row in rows} <= {"complete", "pruned"}, rows
    assert summary["counts"]["pruned"] >= 1, rows  # the median pruner stopped at least one
    retried = [row for row in rows if len(row["attempts"]) > 1]
    assert len(retried) == 1 and len(retried[0]["attempts"]) == 2, rows
    assert retried[0]["workers"][0].endswith(f":{held}") and not retried[0]["workers"][1].endswith(f":{held}")
    for row in rows:
        records = [json.loads(line) for line in (Path(row["folder"]) / "log.jsonl").read_text().splitlines()]
        starts = [index for index, record in enumerate(records) if record["event"] == "start"]
        if row is not retried[0]:
            assert len(starts) == 1, row  # no trial ran twice
            continue
        # The retry resumed the killed attempt's run folder from its checkpoint at step 4: its first step is 5.
        assert len(starts) == 2, row
        assert [r["step"] for r in records[:starts[1]] if r["event"] == "checkpoint"] == [4]
        assert next(r["step"] for r in records[starts[1]:] if r["event"] == "train") == 6  # log_every = 2

    study = optuna.load_study(study_name="three-workers", storage=postgres_url)
    attempts = [t for t in study.get_trials() if not t.user_attrs.get("tpuplex.surplus")]
    assert len(attempts) == trials + 1  # the N trials and one retry; surplus trials never trained
    assert sum(t.state.name == "FAIL" for t in attempts) == 1  # the killed attempt, failed by its heartbeat


def test_a_bare_postgresql_url_is_read_with_the_driver_installed(write_config, tmp_path, postgres_url,
                                                                 monkeypatch) -> None:
    """docs/tune.md's `--storage postgresql://...` against the real server: with psycopg 3 (the [tune] extra's), and
    with psycopg2 alone where it is installed (psycopg 3 hidden), as the docs allow."""
    bare = postgres_url.replace("postgresql+psycopg://", "postgresql://")
    drivers = ["psycopg"] + (["psycopg2"] if importlib.util.find_spec("psycopg2") is not None else [])
    for driver in drivers:
        if driver == "psycopg2":
            monkeypatch.setitem(sys.modules, "psycopg", None)  # not importable, as where only psycopg2 is installed
        config = tune_config(write_config, tmp_path, trials=1, study=f"bare-url-{driver}")
        tuned = tpuplex.tune(config, "numpy", storage=bare, output=tmp_path / f"tune-{driver}")
        assert tuned.summary["storage"].startswith(f"postgresql+{driver}://tpuplex@127.0.0.1:")
        assert [row["state"] for row in tuned.trials] == ["complete"]


def _poll(check, what: str):
    deadline = time.monotonic() + TIMEOUT_S
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def _tail(folder: Path) -> str:
    return "\n".join(f"{log.name}: {log.read_text()[-2000:]}" for log in sorted(folder.glob("worker-*.log")))

"""`tpuplex tune` and `tpuplex.tune` on bad input and on what a new user meets (issue 86), on the numpy backend.

- A folder tpuplex tune did not make is refused before anything is written, whatever its files are named (a
  study.db of the user's own included).
- Every trial failing on one input error is that error (exit 2), found before any trial where it can be.
- A backend that does not exist, and an argument of the wrong type, are one line naming what is wanted.
- A bare postgresql:// URL is read with the driver that is installed; with none, one line says what to install.
- best.toml names its inputs by absolute paths: it trains from any working directory.
- `tpuplex report` over a study's trials: an unfinished trial is a note, the table shows the sampled values.
- A study or a resume refused for another configuration names the fields that differ.
- An MFU note is said once in a study, not in each trial.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import tomllib
from pathlib import Path

import pytest
from test_tune import cli_error, tune_config

import tpuplex
from tpuplex.commands import cli
from tpuplex.commands import run as run_lib
from tpuplex.commands.tune import storage as storage_lib
from tpuplex.config import Config
from tpuplex.errors import ConfigError, TpuplexError

optuna = pytest.importorskip("optuna")


def short_tune(write_config, tmp_path: Path, trials: int = 2, **tune_fields) -> Path:
    """tune_config's search cut to `trials` trials of 8 steps (evaluated at 4 and 8)."""
    path = tune_config(write_config, tmp_path, trials=trials, **tune_fields)
    path.write_text(path.read_text().replace("[train]\n", "[train]\nmax_steps = 8\n", 1))
    return path


def snapshot(folder: Path) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


# -- the tune folder ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("theirs", [
    {"study.db": "sqlite", "notes.txt": "mine"},
    {"tune.json": '{"format": "mine"}'},
    {"trial-0": None},
])
def test_a_folder_tune_did_not_make_is_refused_before_anything_is_written(write_config, tmp_path, capsys,
                                                                          theirs) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, content in theirs.items():
        if content == "sqlite":  # a database of the user's own, with a table of theirs
            with sqlite3.connect(folder / name) as database:
                database.execute("create table notes (line text)")
                database.execute("insert into notes values ('keep me')")
            database.close()
        elif content is None:
            (folder / name).mkdir()
        else:
            (folder / name).write_text(content)
    before = snapshot(folder)
    listing = sorted(path.name for path in folder.rglob("*"))
    message = cli_error(["tune", str(short_tune(write_config, tmp_path)), "--backend", "numpy", "--output",
                         str(folder)], capsys)
    assert message.startswith(f"--output {str(folder)!r} holds files tpuplex tune did not write (")
    assert snapshot(folder) == before and sorted(path.name for path in folder.rglob("*")) == listing
    with pytest.raises(TpuplexError, match="holds files tpuplex tune did not write"):
        tpuplex.tune(short_tune(write_config, tmp_path), "numpy", output=folder)
    assert snapshot(folder) == before


def test_a_runtime_output_dir_of_the_users_is_refused_by_that_name(write_config, tmp_path, capsys) -> None:
    config = short_tune(write_config, tmp_path)
    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / "study.db").write_text("mine")
    message = cli_error(["tune", str(config), "--backend", "numpy"], capsys)
    assert message.startswith(f"runtime.output_dir {str(tmp_path / 'tune')!r} holds files tpuplex tune did not "
                              "write (study.db)")
    assert (tmp_path / "tune" / "study.db").read_text() == "mine"


def test_a_tune_folder_goes_on_and_an_empty_one_is_taken(write_config, tmp_path, capsys) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    config = short_tune(write_config, tmp_path, trials=1)
    assert cli.main(["tune", str(config), "--backend", "numpy", "--output", str(folder)]) == 0
    assert json.loads((folder / "tune.json").read_text())["format"] == "tpuplex.tune/1"
    again = tpuplex.tune(config, "numpy", output=folder, trials=2)  # the same study, one trial more
    assert [row["trial"] for row in again.trials] == [0, 1]


# -- every trial failing on one input ------------------------------------------------------------------------------


def test_a_data_folder_that_is_not_there_is_one_line_before_any_trial(write_config, tmp_path, capsys) -> None:
    config = short_tune(write_config, tmp_path)
    missing = tmp_path / "no-such-folder"
    message = cli_error(["tune", str(config), "--backend", "numpy", "--data-dir", str(missing)], capsys)
    assert str(missing) in message and "trial" not in message
    assert not (tmp_path / "tune").exists()
    with pytest.raises(TpuplexError, match="no-such-folder"):
        tpuplex.tune(config, "numpy", data_dir=missing)
    assert not (tmp_path / "tune").exists()


def test_trials_that_all_fail_on_one_error_before_they_start_stop_the_study_with_it(write_config, tmp_path, capsys,
                                                                                    monkeypatch) -> None:
    """An input error only a trial finds (here a train that refuses every config): the second trial failing on the
    same line stops the study, exit 2, that line; the study has not run its other trials."""
    def refused(*args, **kwargs):
        raise ConfigError("model.checkpoint /gone cannot be read: give a checkpoint folder")

    monkeypatch.setattr(run_lib, "train", refused)
    config = short_tune(write_config, tmp_path, trials=5)
    message = cli_error(["tune", str(config), "--backend", "numpy"], capsys)
    assert message.startswith("model.checkpoint /gone cannot be read: give a checkpoint folder (trials 0, 1 of study "
                              "'tune' all failed on it and none ran")
    rows = json.loads((tmp_path / "tune" / "tune.json").read_text())["trials"]
    assert [row["state"] for row in rows] == ["fail", "fail"] and rows[0]["error"].startswith("model.checkpoint")


def test_a_study_whose_every_trial_failed_on_one_error_is_that_error(write_config, tmp_path, monkeypatch) -> None:
    """Trials that start and then all fail on one line (a loss that is not finite, say) end the command with it."""
    def diverged(config, *args, **kwargs):
        Path(config.runtime.output_dir).mkdir(parents=True)
        (Path(config.runtime.output_dir) / "run.json").write_text("{}")  # the run started
        raise TpuplexError("the training loss became nan at step 3")

    monkeypatch.setattr(run_lib, "train", diverged)
    with pytest.raises(TpuplexError, match=r"^the training loss became nan at step 3 \(trials 0, 1, 2 of study"):
        tpuplex.tune(short_tune(write_config, tmp_path, trials=3), "numpy")


# -- backends and argument types -------------------------------------------------------------------------------------


def test_a_backend_that_does_not_exist_is_one_line_naming_the_backends(write_config, tmp_path, capsys) -> None:
    config = short_tune(write_config, tmp_path)
    message = cli_error(["tune", str(config), "--backend", "pytorch"], capsys)
    assert message == "backend 'pytorch' is not known: use one of jax, tf, torch"
    with pytest.raises(ConfigError, match="^backend 'pytorch' is not known: use one of jax, tf, torch$"):
        tpuplex.tune(config, "pytorch")
    with pytest.raises(ConfigError, match=r"^tpuplex.tune's backend takes the name of a backend, e.g. \"torch\", not "
                                          "int 5$"):
        tpuplex.tune(config, 5)
    assert not (tmp_path / "tune").exists()


@pytest.mark.parametrize(("arguments", "message"), [
    ({"config": 123}, "tpuplex.tune's config takes a Config or the path of a TOML config, not int 123"),
    ({"search": "trials=3"}, "tpuplex.tune's search takes a dict of [tune] fields, e.g. {\"trials\": 3}, not str "
     "'trials=3'"),
    ({"output": 5}, "tpuplex.tune's output takes the path of the tune folder (a str or Path), not int 5"),
    ({"overrides": 5}, "tpuplex.tune's overrides takes a dict {\"section.field\": value} or a list of "
     "\"section.field=value\" strings, not int 5"),
    ({"overrides": [5]}, "tpuplex.tune's overrides takes \"section.field=value\" strings or a dict, not [5]"),
    ({"trials": "3"}, "tpuplex.tune's trials takes a number of trials (an int), not str '3'"),
    ({"storage": 5}, "tpuplex.tune's storage takes an SQLAlchemy URL"),
    ({"data_dir": 5}, "tpuplex.tune's data_dir takes the path of the data folder (a str or Path), not int 5"),
])
def test_an_argument_of_the_wrong_type_is_one_line_naming_it(write_config, tmp_path, arguments, message) -> None:
    config = arguments.pop("config", short_tune(write_config, tmp_path))
    with pytest.raises(ConfigError) as raised:
        tpuplex.tune(config, "numpy", **arguments)
    assert str(raised.value).startswith(message)
    assert not (tmp_path / "tune").exists()


# -- the PostgreSQL driver --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("installed", "message"), [
    ({"psycopg", "psycopg2"}, "--storage postgresql+psycopg://tpuplex:***@127.0.0.1:{port}/tune cannot be reached"),
    ({"psycopg2"}, "--storage postgresql+psycopg2://tpuplex:***@127.0.0.1:{port}/tune "),
    (set(), "--storage postgresql://tpuplex:***@127.0.0.1:{port}/tune needs a PostgreSQL driver, and none is "
            "installed: pip install 'psycopg[binary]' (or pip install 'tpuplex-core[tune]')"),
])
def test_a_bare_postgresql_url_is_read_with_the_driver_installed(write_config, tmp_path, capsys, monkeypatch,
                                                                 installed, message) -> None:
    """psycopg 3 when it is installed, else psycopg2 (SQLAlchemy alone takes psycopg 3 for a bare URL, installed or
    not); with neither, one line. The port has no server: the driver is chosen before the server is reached."""
    import socket

    monkeypatch.setattr(storage_lib, "_importable", lambda name: name in installed)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://tpuplex:secret@127.0.0.1:{port}/tune"
    said = cli_error(["tune", str(short_tune(write_config, tmp_path)), "--backend", "numpy", "--storage", url],
                     capsys)
    assert said.startswith(message.format(port=port)) and "secret" not in said
    assert not (tmp_path / "tune").exists()


def test_the_tune_extra_installs_the_postgresql_driver() -> None:
    pyproject = tomllib.loads((Path(__file__).parents[2] / "packages/core/pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"]["tune"]
    assert any(requirement.startswith("psycopg[binary]") for requirement in extra), extra


# -- best.toml from any working directory -------------------------------------------------------------------------


def test_best_toml_names_absolute_paths_and_trains_from_another_folder(write_config, tmp_path, tiny_mrpc,
                                                                       monkeypatch) -> None:
    """`--data-dir` and the tune folder given relative to the working directory: best.toml holds them absolute."""
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    shutil.copytree(tiny_mrpc, work / "data" / "MRPC")
    monkeypatch.chdir(work)
    config = short_tune(write_config, tmp_path, trials=1)
    assert cli.main(["tune", str(config), "--backend", "numpy", "--data-dir", "data/MRPC", "--output", "out",
                     "--set", "data.cache_dir=cache"]) == 0
    best = tomllib.loads((work / "out" / "best.toml").read_text())
    assert best["data"]["data_dir"] == str(work / "data" / "MRPC")
    assert best["data"]["cache_dir"] == str(work / "cache")
    assert best["runtime"]["output_dir"] == str(work / "out" / "best")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert cli.main(["train", str(work / "out" / "best.toml"), "--backend", "numpy"]) == 0
    trained = json.loads((work / "out" / "best" / "results.json").read_text())
    trial = json.loads((work / "out" / "trial-0" / "results.json").read_text())
    assert trained["metrics"] == trial["metrics"] and trained["config_hash"] == trial["config_hash"]
    assert list(elsewhere.iterdir()) == []


# -- tpuplex report over a study ----------------------------------------------------------------------------------


def test_report_over_a_study_notes_an_unfinished_trial_and_shows_the_sampled_values(write_config, tmp_path,
                                                                                     capsys) -> None:
    pytest.importorskip("matplotlib")
    tuned = tpuplex.tune(short_tune(write_config, tmp_path, trials=3), "numpy")
    folder = tuned.folder
    (folder / "trial-1" / "results.json").unlink()  # as a pruned trial's folder is: no results.json
    capsys.readouterr()
    for given in ([str(folder / f"trial-{n}") for n in range(3)], [str(folder)]):
        out = tmp_path / f"report-{len(given)}"
        assert cli.main(["report", *given, "--out", str(out)]) == 0
        err = capsys.readouterr().err
        assert "tpuplex report: note: trial-1 left out: no results.json" in err
        rows = (out / "report.md").read_text().splitlines()
        header = [cell.strip() for cell in rows[0].strip("|").split("|")]
        assert header[-2:] == ["train.learning_rate", "train.warmup_ratio"] and len(rows) == 2 + 2
        for line, number in zip(rows[2:], (0, 2), strict=True):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            params = tuned.trials[number]["params"]
            assert cells[0] == f"trial-{number}"
            assert cells[-2:] == [f"{params['train.learning_rate']:.4g}", f"{params['train.warmup_ratio']:.4g}"]


def test_report_over_only_unfinished_runs_is_one_line(write_config, tmp_path, capsys) -> None:
    tuned = tpuplex.tune(short_tune(write_config, tmp_path, trials=1), "numpy")
    (tuned.folder / "trial-0" / "results.json").unlink()
    message = cli_error(["report", str(tuned.folder / "trial-0"), "--out", str(tmp_path / "report")], capsys)
    assert message.startswith("none of the runs given has finished (trial-0)")


def test_report_over_a_tune_folder_with_no_trial_yet_is_one_line(tmp_path, capsys) -> None:
    from tpuplex.commands.tune import summary

    summary.mark_folder(tmp_path / "tune")  # as tune leaves it before its first trial
    message = cli_error(["report", str(tmp_path / "tune"), "--out", str(tmp_path / "report")], capsys)
    assert message == f"{tmp_path / 'tune'} holds no run yet: tpuplex report needs a run with its results.json"


# -- another configuration: the fields that differ ------------------------------------------------------------------


def test_a_resume_refused_for_another_config_names_the_fields_that_differ(write_config, capsys) -> None:
    path = write_config()
    assert cli.main(["train", str(path), "--backend", "numpy", "--set", "train.max_steps=3"]) == 0
    capsys.readouterr()
    assert cli.main(["train", str(path), "--backend", "numpy", "--set", "train.max_steps=3", "--set",
                     "train.learning_rate=0.01", "--set", "train.weight_decay=0.5"]) == 2
    err = capsys.readouterr().err
    assert ("was written with another configuration (train.learning_rate = 0.05, now 0.01; train.weight_decay = "
            "0.01, now 0.5): restore that configuration") in err


def test_a_study_made_for_another_config_names_the_fields_that_differ(write_config, tmp_path, capsys) -> None:
    config = short_tune(write_config, tmp_path, trials=1)
    assert cli.main(["tune", str(config), "--backend", "numpy"]) == 0
    message = cli_error(["tune", str(config), "--backend", "numpy", "--set", "train.adam_beta2=0.98"], capsys)
    assert "was created with another config (train.adam_beta2 = 0.999, now 0.98): give this search" in message


def test_config_changes_from_lists_each_field_that_enters_the_hash() -> None:
    before = Config.from_dict({"train": {"learning_rate": 3e-5, "max_steps": 10}, "data": {"buckets": [16, 32]}})
    after = before.override({"train.learning_rate": 1e-4, "train.max_steps": 20, "runtime.output_dir": "elsewhere",
                             "task.label_smoothing": 0.1})
    recorded = json.loads(json.dumps(before.to_dict()))  # as run.json and a checkpoint hold it
    assert after.changes_from(recorded) == ["task.label_smoothing = 'unset', now 0.1",
                                            "train.learning_rate = 3e-05, now 0.0001"]
    assert after.changes_from(recorded, with_length=True)[-1] == "train.max_steps = 10, now 20"
    assert before.changes_from(recorded) == []


# -- notes said once in a study ---------------------------------------------------------------------------------------


def test_an_mfu_note_is_said_once_in_a_study(write_config, tmp_path, capsys) -> None:
    config = short_tune(write_config, tmp_path, trials=3)
    assert cli.main(["tune", str(config), "--backend", "numpy", "--set", "runtime.peak_tflops=1e-9"]) == 0
    captured = capsys.readouterr()
    said = (captured.out + captured.err).count("MFU left out")
    assert said == 1, said


def test_tune_md_and_the_docs_example_hold_no_machine_paths() -> None:
    text = (Path(__file__).parents[2] / "docs" / "tune.md").read_text()
    for machine in ("/work/", "/tmp/", "/home/", "/Users/"):
        assert machine not in text, machine

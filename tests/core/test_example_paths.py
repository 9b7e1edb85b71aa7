"""A config file's paths are relative to the file: every example config loads to the same run from the repository
root and from its own folder (tests/torch/test_examples.py trains each from the root), and a command-line path
stays relative to where the command runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tpuplex import config

REPO = Path(__file__).resolve().parents[2]
TRACKED = subprocess.run(["git", "ls-files", "-z", "examples"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split("\0")
EXAMPLES = sorted(REPO / name for name in TRACKED if name.endswith(".toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(REPO)))
def test_an_example_loads_to_the_same_run_from_the_root_and_from_its_folder(path, monkeypatch, shared_text,
                                                                           shared_images) -> None:
    monkeypatch.chdir(REPO)
    from_root = config.load(path.relative_to(REPO))
    monkeypatch.chdir(path.parent)
    from_folder = config.load(path.name)
    assert from_folder.to_dict() == from_root.to_dict()
    data = from_root.data
    for given in (data.train_file, *data.eval_files, data.test_file):
        assert not given or Path(given).is_absolute() and Path(given).exists(), given
    checkpoint = from_root.model.checkpoint
    assert checkpoint in ("minilm", "smollm2") or (Path(checkpoint).is_absolute()
                                                   and (Path(checkpoint) / "config.json").is_file())


def test_a_path_on_the_command_line_stays_relative_to_where_the_command_runs(tmp_path, monkeypatch) -> None:
    (tmp_path / "configs" / "data").mkdir(parents=True)
    (tmp_path / "configs" / "data" / "train.csv").write_text("label,text\n1,a\n")
    (tmp_path / "configs" / "run.toml").write_text('[data]\ntrain_file = "data/train.csv"\n'
                                                   'test_file = "elsewhere.csv"\n')
    monkeypatch.chdir(tmp_path)
    loaded = config.load(Path("configs/run.toml"), ['data.eval_files=["data/dev.csv"]'])
    assert loaded.data.train_file == str(tmp_path / "configs" / "data" / "train.csv")
    assert loaded.data.test_file == "elsewhere.csv"  # not beside the config: relative to the working directory
    assert loaded.data.eval_files == ("data/dev.csv",)


def test_a_config_path_found_only_in_the_working_directory_is_read_with_a_note(tmp_path, monkeypatch,
                                                                                capsys) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "run.toml").write_text('[data]\ntrain_file = "train.csv"\ntest_file = "test.csv"\n')
    (tmp_path / "train.csv").write_text("label,text\n1,a\n")
    monkeypatch.chdir(tmp_path)
    loaded = config.load(Path("configs/run.toml"))
    assert loaded.data.train_file == "train.csv"
    assert capsys.readouterr().err == (f"tpuplex: note: data.train_file = 'train.csv' is not in {tmp_path / 'configs'};"
                                       f" read from the working directory: {tmp_path / 'train.csv'}\n")

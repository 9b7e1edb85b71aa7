"""The portable checkpoint: exact round trip, atomic writes, keeping the newest N, a full disk, and damaged
checkpoints found by their manifest and skipped."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from tpuplex.engine import checkpoint
from tpuplex.errors import TpuplexError
from tpuplex.hosts import Hosts
from tpuplex.protocol import PortableState


def state(step: int, seed: int = 0) -> PortableState:
    rng = np.random.default_rng(seed)
    params = {"classifier.weight": rng.standard_normal((2, 4)).astype(np.float32),
              "classifier.bias": rng.standard_normal(2).astype(np.float32)}
    return PortableState(params=params,
                         exp_avg={name: rng.standard_normal(a.shape).astype(np.float32) for name, a in params.items()},
                         exp_avg_sq={name: rng.random(a.shape).astype(np.float32) for name, a in params.items()},
                         step=step)


def test_round_trip_is_exact(tmp_path) -> None:
    original = state(12)
    path = checkpoint.save(tmp_path, original, {"step": 12, "epoch": 1, "position": 3, "metrics": {"dev": {}}}, 2)
    assert path.name == "step-00000012"
    loaded, info = checkpoint.load(path)
    assert loaded.step == 12 and info["position"] == 3 and info["optimizer_step"] == 12
    for kind in ("params", "exp_avg", "exp_avg_sq"):
        expected, got = getattr(original, kind), getattr(loaded, kind)
        assert set(expected) == set(got)
        assert all(np.array_equal(expected[name], got[name]) for name in expected)


def test_keeps_the_newest(tmp_path) -> None:
    for step in (1, 2, 3, 4):
        checkpoint.save(tmp_path, state(step), {"step": step}, keep=2)
    assert [p.name for p in checkpoint.checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]
    assert checkpoint.latest(tmp_path).name == "step-00000004"


def test_staging_directories_are_ignored(tmp_path) -> None:
    checkpoint.save(tmp_path, state(5), {"step": 5}, keep=3)
    (tmp_path / ".step-00000009-abc").mkdir()  # what a crash in the middle of a save leaves
    (tmp_path / ".step-00000009-abc" / "model.safetensors").write_bytes(b"partial")
    assert checkpoint.latest(tmp_path).name == "step-00000005"


def test_the_next_save_removes_what_a_killed_save_left_and_nothing_of_yours(tmp_path) -> None:
    checkpoint.save(tmp_path, state(5), {"step": 5}, keep=3)
    killed = tmp_path / ".step-00000009.writing-0badcafe"  # a SIGKILL in the middle of a save
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"partial")
    (killed / "optimizer.process-00001.safetensors").write_bytes(b"partial")
    (tmp_path / ".step-00000008.writing-12345678").mkdir()  # killed before writing a file
    yours = tmp_path / ".step-00000009.writing-00c0ffee"
    yours.mkdir()
    (yours / "notes.txt").write_text("mine")
    (tmp_path / ".step-00000007.writing-abcdef01").write_text("a file of yours")
    checkpoint.save(tmp_path, state(6), {"step": 6}, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step-00000007.writing-abcdef01", yours.name,
                                                          "step-00000005", "step-00000006"]
    assert (yours / "notes.txt").read_text() == "mine"


def test_a_failed_save_leaves_the_previous_checkpoint_and_nothing_else(tmp_path, monkeypatch) -> None:
    checkpoint.save(tmp_path, state(1), {"step": 1}, keep=2)
    before = sorted(p.name for p in tmp_path.iterdir())

    def disk_full(tensors, path, metadata=None):
        Path(path).write_bytes(b"partial")  # what a full disk leaves of a file
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint, "save_file", disk_full)
    with pytest.raises(TpuplexError, match=r"^could not write checkpoint .*step-00000002 \(No space left on device\); "
                                           r"the checkpoints already in .* are untouched: free space"):
        checkpoint.save(tmp_path, state(2), {"step": 2}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no staging directory left
    assert checkpoint.verify(tmp_path / "step-00000001") is None


def test_an_unwritable_output_folder_is_one_clear_error(tmp_path) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(TpuplexError, match=r"could not write checkpoint .*file/checkpoints/step-00000001"):
        checkpoint.save(tmp_path / "file" / "checkpoints", state(1), {"step": 1}, keep=2)


def damage_truncated_model(path: Path) -> None:
    model = path / "model.safetensors"
    model.write_bytes(model.read_bytes()[:100])


def damage_trainer_json(path: Path) -> None:
    (path / "trainer.json").write_text("{not json")


def damage_missing_file(path: Path) -> None:
    (path / "optimizer.safetensors").unlink()


def damage_flipped_byte(path: Path) -> None:
    model = path / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-1] ^= 1
    model.write_bytes(bytes(data))


DAMAGES = {"truncated model.safetensors": (damage_truncated_model, "model.safetensors has 100 bytes"),
           "trainer.json not JSON": (damage_trainer_json, "trainer.json has 9 bytes"),
           "missing file": (damage_missing_file, "no optimizer.safetensors"),
           "one flipped byte": (damage_flipped_byte, "model.safetensors does not match its sha256")}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_latest_checkpoint_is_reported_and_skipped(damage, tmp_path) -> None:
    for step in (1, 2):
        checkpoint.save(tmp_path, state(step), {"step": step}, keep=3)
    corrupt, problem = DAMAGES[damage]
    corrupt(tmp_path / "step-00000002")
    reported = []
    assert checkpoint.latest_good(tmp_path, reported.append) == tmp_path / "step-00000001"
    assert len(reported) == 1
    assert reported[0].startswith(f"skipping damaged checkpoint {tmp_path / 'step-00000002'} ({problem}")


def test_no_good_checkpoint_is_one_clear_error(tmp_path) -> None:
    damage_missing_file(checkpoint.save(tmp_path, state(1), {"step": 1}, keep=2))
    damage_trainer_json(checkpoint.save(tmp_path, state(2), {"step": 2}, keep=2))
    with pytest.raises(TpuplexError, match=r"no usable checkpoint in .* \(step-00000002: trainer.json has 9 bytes, .*; "
                                           r"step-00000001: no optimizer.safetensors\): restore a good checkpoint"):
        checkpoint.latest_good(tmp_path, lambda line: None)
    assert checkpoint.latest_good(tmp_path / "absent", lambda line: None) is None


def test_no_checkpoints_yet(tmp_path) -> None:
    assert checkpoint.latest(tmp_path / "absent") is None


def test_an_incomplete_directory_is_named_on_load(tmp_path) -> None:
    path = checkpoint.save(tmp_path, state(3), {"step": 3}, keep=1)
    (path / "optimizer.safetensors").unlink()
    with pytest.raises(TpuplexError, match=r"is damaged or incomplete \(no optimizer.safetensors\)"):
        checkpoint.load(path)


def test_a_staging_name_already_taken_is_refused_and_left_as_it_was(tmp_path, monkeypatch) -> None:
    """The staging directory's name carries a random number; were it taken, the save fails in one line and the
    directory found there, not made by this save, keeps its files."""
    monkeypatch.setattr(Hosts, "shared_token", lambda self, what: 0xABCD)
    taken = tmp_path / ".step-00000001.writing-0000abcd"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with pytest.raises(TpuplexError, match=r"^could not write checkpoint .*step-00000001 \(File exists\)"):
        checkpoint.save(tmp_path, state(1), {"step": 1}, keep=2)
    assert (taken / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [taken.name]

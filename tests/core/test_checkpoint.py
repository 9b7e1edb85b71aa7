"""The portable checkpoint: exact round trip, atomic writes, keeping the newest N."""

from __future__ import annotations

import numpy as np
import pytest

from tpuplex import checkpoint
from tpuplex.errors import TpuplexError
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


def test_a_failed_save_leaves_the_previous_checkpoint_and_nothing_else(tmp_path, monkeypatch) -> None:
    checkpoint.save(tmp_path, state(1), {"step": 1}, keep=2)
    before = sorted(p.name for p in tmp_path.iterdir())

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", disk_full)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path, state(2), {"step": 2}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_no_checkpoints_yet(tmp_path) -> None:
    assert checkpoint.latest(tmp_path / "absent") is None


def test_an_incomplete_directory_is_named_on_load(tmp_path) -> None:
    path = checkpoint.save(tmp_path, state(3), {"step": 3}, keep=1)
    (path / "optimizer.safetensors").unlink()
    with pytest.raises(TpuplexError, match="is incomplete .no optimizer.safetensors."):
        checkpoint.load(path)

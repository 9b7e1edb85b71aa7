"""FSDP2 on 4 CPU processes over gloo (`runtime.mesh` with fsdp, docs/sharding.md): a Llama (and, in the long
tier, Gemma 2) from a config.json trains on tiny Shakespeare to the numbers of the same run replicated over the 4
processes, and each process holds
its quarter of the parameters and Adam's moments. Each run is `tpuplex launch` of the CLI, as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from llama_runs import GEMMA2, train_losses, write_llama_run
from multihost_checks import finish, launch_args, tpuplex

from tpuplex import registry
from tpuplex.config import RuntimeConfig
from tpuplex.engine import checkpoint
from tpuplex.errors import MeshError, TpuplexError
from tpuplex_torch import devices

STEPS = 6


@pytest.fixture(scope="module")
def config(shared_text, tmp_path_factory) -> Path:
    return write_llama_run(tmp_path_factory.mktemp("fsdp"), shared_text, STEPS, STEPS)


def launched(config: Path, output_dir: Path, mesh: str, *sets: str) -> dict:
    status, output = finish(tpuplex(launch_args(4, 0, config, "torch", output_dir, f"runtime.mesh={mesh}", *sets)))
    assert status == 0, output
    return json.loads((output_dir / "results.json").read_text())


def losses(output_dir: Path) -> np.ndarray:
    return np.array(list(train_losses(output_dir).values()))


@pytest.fixture(scope="module")
def replicated(config, tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("replicated")
    return folder, launched(config, folder, "{data = 4}")


@pytest.mark.parametrize("mesh", [pytest.param("{fsdp = 4}", id="fsdp4"),
                                  pytest.param("{data = 2, fsdp = 2}", id="hsdp", marks=pytest.mark.long)])
def test_fsdp_on_four_processes_trains_as_replicated(config, replicated, tmp_path, mesh) -> None:
    expected_dir, expected = replicated
    results = launched(config, tmp_path, mesh)
    assert "FSDP2" in results["topology"]
    np.testing.assert_allclose(losses(tmp_path), losses(expected_dir), rtol=1e-5)
    assert len(losses(tmp_path)) == STEPS
    step = f"step-{STEPS:08d}"
    # The sharded run's checkpoint is each process's shards; read whole, it is the replicated run's.
    (want, _), (have, _) = (checkpoint.load(run / "checkpoints" / step) for run in (expected_dir, tmp_path))
    for kind in ("params", "exp_avg", "exp_avg_sq", "buffers"):
        assert getattr(want, kind).keys() == getattr(have, kind).keys()
        for name, array in getattr(want, kind).items():
            np.testing.assert_allclose(np.asarray(getattr(have, kind)[name]), np.asarray(array), rtol=0, atol=1e-5,
                                       err_msg=name)
    fsdp = 4 if mesh == "{fsdp = 4}" else 2
    assert results["state_bytes_per_device"] <= 1.1 * expected["state_bytes_per_device"] / fsdp


@pytest.mark.long
def test_gemma2_over_fsdp_trains_as_replicated(shared_text, tmp_path) -> None:
    """A new decoder family under FSDP2 on 4 processes: Gemma 2's own switches, each process holding its shards,
    give the replicated run's losses."""
    config = write_llama_run(tmp_path, shared_text, STEPS, STEPS, GEMMA2)
    expected, results = launched(config, tmp_path / "data", "{data = 4}"), launched(config, tmp_path / "fsdp",
                                                                                     "{fsdp = 4}")
    assert "FSDP2" in results["topology"]
    assert results["state_bytes_per_device"] <= 1.1 * expected["state_bytes_per_device"] / 4
    np.testing.assert_allclose(losses(tmp_path / "fsdp"), losses(tmp_path / "data"), rtol=1e-5)
    assert len(losses(tmp_path / "fsdp")) == STEPS


@pytest.mark.long
def test_lora_over_a_base_sharded_by_fsdp_trains_as_replicated(config, tmp_path) -> None:
    """LoRA on a base FSDP2 splits over 4 processes (the base frozen in its shards): the losses and adapters of
    the same LoRA run replicated over the 4 processes, the checkpoint the adapters' slices alone."""
    lora = 'model.lora={rank = 8, targets = ["q_proj", "v_proj", "down_proj"]}'
    expected, results = launched(config, tmp_path / "data", "{data = 4}", lora), launched(
        config, tmp_path / "fsdp", "{fsdp = 4}", lora)
    assert "FSDP2" in results["topology"] and results["parameters"] == expected["parameters"]
    np.testing.assert_allclose(losses(tmp_path / "fsdp"), losses(tmp_path / "data"), rtol=1e-5)
    (want, _), (have, _) = (checkpoint.load(tmp_path / run / "checkpoints" / f"step-{STEPS:08d}")
                            for run in ("data", "fsdp"))
    assert have.params.keys() == want.params.keys() == have.exp_avg.keys()
    assert all(".lora_" in name for name in have.params)
    for name, array in want.params.items():
        np.testing.assert_allclose(np.asarray(have.params[name]), np.asarray(array), rtol=0, atol=1e-5, err_msg=name)


def test_a_tensor_axis_is_refused_in_one_line() -> None:
    with pytest.raises(TpuplexError, match=r"has tensor = 2, which the torch backend does not split .*--backend jax"):
        devices.mesh_of(RuntimeConfig(mesh={"fsdp": 2, "tensor": 2}), 4)


def test_a_mesh_above_one_process_names_the_launch_that_gives_its_devices() -> None:
    with pytest.raises(MeshError, match=r"runtime.mesh = \{'fsdp': 4\} does not fit the 1 device\(s\) of this run "
                                        r"\(the other axes' 4 does not divide them\): eager torch runs one device "
                                        r"per process: start 4 with tpuplex launch --processes 4 -- train \.\.\."):
        registry.create("torch", RuntimeConfig(mesh={"fsdp": 4}))

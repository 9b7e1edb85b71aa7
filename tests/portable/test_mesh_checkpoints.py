"""A checkpoint moves between meshes and frameworks (docs/sharding.md): a Llama trained on tiny Shakespeare with
torch FSDP2 resumes on jax sharded over fsdp, then on jax replicated, then on torch again, each continuing with the
losses of the uninterrupted run. Every hop is a CLI run in fresh processes (`tpuplex launch` for torch's processes,
host CPU devices for jax) in the same run folder; a hop resumes from a checkpoint because the later ones are
removed, as a preempted run would have left them. The first run's HF export loads in transformers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from llama_runs import train_losses, write_llama_run
from multihost_checks import finish, launch_args, tpuplex, train_args
from safetensors import safe_open

from tpuplex.engine import checkpoint

EVERY = 2
"""Steps between checkpoints; a chain of n hops trains n x EVERY steps, each hop after the first resuming from the
checkpoint the hop before it wrote last."""
CHAINS = {
    "fast": [("torch", 2, "{fsdp = 2}"), ("jax", 4, "{fsdp = 4}"), ("jax", 4, "{data = 4}")],
    "issue": [("torch", 4, "{fsdp = 4}"), ("jax", 8, "{fsdp = 8}"), ("jax", 8, "{data = 8}"),
              ("torch", 2, "{fsdp = 2}")],
}
"""(backend, processes for torch or host devices for jax, mesh) of each hop."""


def hop(config: Path, run: Path, backend: str, count: int, mesh: str) -> None:
    sets = (f"runtime.mesh={mesh}",)
    if backend == "torch":
        process = tpuplex(launch_args(count, 0, config, backend, run, *sets))
    else:
        process = tpuplex(train_args(config, backend, run, *sets),
                          launched_as={"XLA_FLAGS": f"--xla_force_host_platform_device_count={count}"})
    status, output = finish(process)
    assert status == 0, output


def cut_to(run: Path, step: int) -> None:
    """Remove the checkpoints after `step` and the results: the next hop resumes from `step`."""
    for folder in sorted((run / "checkpoints").glob("step-*")):
        if int(folder.name.split("-")[1]) > step:
            shutil.rmtree(folder)
    (run / "results.json").unlink()


@pytest.mark.parametrize("chain", [pytest.param("fast"), pytest.param("issue", marks=pytest.mark.long)])
def test_a_checkpoint_resumes_across_meshes_and_frameworks(shared_text, tmp_path, chain) -> None:
    hops = CHAINS[chain]
    steps = EVERY * len(hops)
    config = write_llama_run(tmp_path, shared_text, steps, EVERY)
    uninterrupted, run = tmp_path / "uninterrupted", tmp_path / "run"
    hop(config, uninterrupted, *hops[0])
    expected = train_losses(uninterrupted)
    assert sorted(expected) == list(range(1, steps + 1))
    # Each torch process wrote its own shards: none gathered the state.
    step_dir = uninterrupted / "checkpoints" / f"step-{EVERY:08d}"
    written = {p.name: held_slices(p) for p in step_dir.glob("model*.safetensors")}
    assert written.keys() == {"model.safetensors",
                              *(f"model.process-{i:05d}.safetensors" for i in range(1, hops[0][1]))}
    assert all(written.values()), written
    shutil.copytree(uninterrupted, run)
    for index, (backend, count, mesh) in enumerate(hops[1:], start=1):
        resumed_from = EVERY * index
        cut_to(run, resumed_from)
        hop(config, run, backend, count, mesh)
        got = train_losses(run)
        later = range(resumed_from + 1, steps + 1)
        np.testing.assert_allclose([got[step] for step in later], [expected[step] for step in later], rtol=1e-5,
                                   err_msg=f"{backend} {mesh} resumed from step {resumed_from}")
        results = json.loads((run / "results.json").read_text())
        assert results["resumed_from"].endswith(f"step-{resumed_from:08d}")
    check_hf_export(uninterrupted, steps)


def held_slices(path: Path) -> int:
    """How many slices (parts of arrays, not whole ones) a checkpoint file holds."""
    with safe_open(path, framework="np") as stored:
        return len(json.loads((stored.metadata() or {}).get(checkpoint.SLICES_METADATA, "{}")))


def check_hf_export(run: Path, step: int) -> None:
    """`tpuplex export --format hf` of a run whose checkpoint is torch FSDP2's per-process shards: transformers
    loads it, with the checkpoint's weights."""
    status, output = finish(tpuplex(["export", str(run), "--format", "hf"]))
    assert status == 0, output
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(run / "export" / f"step-{step:08d}-hf")
    stored, _ = checkpoint.load(run / "checkpoints" / f"step-{step:08d}")
    loaded = model.state_dict()
    for name, array in stored.params.items():
        np.testing.assert_array_equal(loaded[name].numpy(), np.asarray(array), err_msg=name)

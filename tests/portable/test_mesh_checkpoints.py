"""A checkpoint moves between meshes and frameworks (docs/sharding.md): a Llama trained on tiny Shakespeare with
torch FSDP2 resumes on jax sharded over fsdp, then on jax replicated, then on torch again, each continuing with the
losses of the uninterrupted run. Every hop is a CLI run in fresh processes (`tpuplex launch` for torch's processes,
host CPU devices for jax) in the same run folder; a hop resumes from a checkpoint because the later ones are
removed, as a preempted run would have left them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from multihost_checks import finish, launch_args, tpuplex, train_args

EVERY = 2
"""Steps between checkpoints; a chain of n hops trains n x EVERY steps, each hop after the first resuming from the
checkpoint the hop before it wrote last."""
LLAMA = {"model_type": "llama", "vocab_size": 128, "max_position_embeddings": 64, "hidden_size": 128,
         "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
CHAINS = {
    "fast": [("torch", 2, "{fsdp = 2}"), ("jax", 4, "{fsdp = 4}"), ("jax", 4, "{data = 4}")],
    "issue": [("torch", 4, "{fsdp = 4}"), ("jax", 8, "{fsdp = 8}"), ("jax", 8, "{data = 8}"),
              ("torch", 2, "{fsdp = 2}")],
}
"""(backend, processes for torch or host devices for jax, mesh) of each hop."""


def write_config(folder: Path, text: str, steps: int) -> Path:
    (folder / "llama").mkdir()
    (folder / "llama" / "config.json").write_text(json.dumps(LLAMA))
    (folder / "shakespeare.txt").write_text(text[:20_000], encoding="utf-8")
    (folder / "config.toml").write_text(f"""
[task]
name = "causal_lm"
tokenizer = "characters"
validation_fraction = 0.05
[model]
checkpoint = "llama"
dropout = false
[data]
dataset = "shakespeare"
train_file = "shakespeare.txt"
max_length = 32
cache_dir = "{folder / 'cache'}"
[train]
learning_rate = 1e-3
max_steps = {steps}
global_batch = 8
seed = 5
[runtime]
log_every = 1
checkpoint_every = {EVERY}
keep_checkpoints = 10
host_timeout = 120
""")
    return folder / "config.toml"


def hop(config: Path, run: Path, backend: str, count: int, mesh: str) -> None:
    sets = (f"runtime.mesh={mesh}",)
    if backend == "torch":
        process = tpuplex(launch_args(count, 0, config, backend, run, *sets))
    else:
        process = tpuplex(train_args(config, backend, run, *sets),
                          launched_as={"XLA_FLAGS": f"--xla_force_host_platform_device_count={count}"})
    status, output = finish(process)
    assert status == 0, output


def losses(run: Path) -> dict[int, float]:
    """The last loss logged for each step (a resumed step's own, not the one the run before it logged)."""
    entries = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return {entry["step"]: entry["loss"] for entry in entries if entry["event"] == "train"}


def cut_to(run: Path, step: int) -> None:
    """Remove the checkpoints after `step` and the results: the next hop resumes from `step`."""
    for folder in sorted((run / "checkpoints").glob("step-*")):
        if int(folder.name.split("-")[1]) > step:
            shutil.rmtree(folder)
    (run / "results.json").unlink()


@pytest.mark.parametrize("chain", [pytest.param("fast"), pytest.param("issue", marks=pytest.mark.long)])
def test_a_checkpoint_resumes_across_meshes_and_frameworks(shared_text, tmp_path, chain) -> None:
    text = (shared_text / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    hops = CHAINS[chain]
    steps = EVERY * len(hops)
    config = write_config(tmp_path, text, steps)
    uninterrupted, run = tmp_path / "uninterrupted", tmp_path / "run"
    hop(config, uninterrupted, *hops[0])
    expected = losses(uninterrupted)
    assert sorted(expected) == list(range(1, steps + 1))
    shutil.copytree(uninterrupted, run)
    for index, (backend, count, mesh) in enumerate(hops[1:], start=1):
        resumed_from = EVERY * index
        cut_to(run, resumed_from)
        hop(config, run, backend, count, mesh)
        got = losses(run)
        later = range(resumed_from + 1, steps + 1)
        np.testing.assert_allclose([got[step] for step in later], [expected[step] for step in later], rtol=1e-5,
                                   err_msg=f"{backend} {mesh} resumed from step {resumed_from}")
        results = json.loads((run / "results.json").read_text())
        assert results["resumed_from"].endswith(f"step-{resumed_from:08d}")

"""A device mesh on the JAX backend (8 host devices): sharded over fsdp (and tensor), a model trains to the numbers
of the same model replicated over the same devices, each device holds its share of the state, and checkpoints are
written and read as slices."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import slow_run
import user_model_checks
from helpers import backend
from llama_runs import write_llama_run
from multihost_checks import train_args
from safetensors import safe_open

from tpuplex import models, sharding
from tpuplex.engine import checkpoint
from tpuplex.kinds import with_adapters
from tpuplex.kinds.decoder import Decoders
from tpuplex.models.lora import Lora
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex.tasks.causal_lm import TASK as CAUSAL_LM
from tpuplex.testing.specs import image_family_spec, network_classifier_spec

pytestmark = pytest.mark.started_first

VOCAB, ROWS, LENGTH = 512, 16, 16
LLAMA = {"model_type": "llama", "vocab_size": VOCAB, "max_position_embeddings": 64, "hidden_size": 128,
         "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
"""A Llama whose weights are large enough to be split (`tpuplex.sharding.MIN_SHARDED_ELEMENTS`)."""
GEMMA2 = {**LLAMA, "model_type": "gemma2", "head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": 8,
          "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
"""Gemma 2 at that size: every switch the Llama lacks (norms after the sublayers, a window on every other layer,
soft caps, scaled embeddings) under the same mesh."""
RESNET = {"model_type": "resnet", "embedding_size": 32, "hidden_sizes": [64, 128], "depths": [1, 1],
          "layer_type": "basic", "embedding_kernel_size": 3, "embedding_stride": 1, "embedding_pooling": False}
"""ResNet with batch norm and CIFAR's stem, its convolutions large enough to be split."""
REPLICATED = {"data": 8}
JAX = "tpuplex_jax.backend:JaxBackend"
OPTIMIZER = OptimizerSpec(weight_decay=0.01, seed=1)
LEARNING_RATE = 1e-3


def write_config(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def llama_spec(folder: Path, config: dict = LLAMA) -> ModelSpec:
    family, arch = models.architecture_of(config)
    kind = Decoders(write_config(folder, config), config, family, arch)
    return ModelSpec(kind=kind, task=CAUSAL_LM, inputs=CAUSAL_LM.inputs, head=CAUSAL_LM.head(family, arch, {}, None),
                     hf_config=config, family=family, arch=arch, params=kind.initial_state(None, 3)[0],
                     dropout=False, checkpoint_dir=folder)


def token_batches(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(count):
        ids = rng.integers(0, VOCAB, (ROWS, LENGTH + 1)).astype(np.int32)
        batches.append({"input_ids": ids[:, :-1], "labels": ids[:, 1:], "weight": np.ones((ROWS, LENGTH), np.float32)})
    return batches


def image_batches(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"images": rng.integers(0, 256, (ROWS, 16, 16, 3)).astype(np.uint8),
             "labels": rng.integers(0, 3, ROWS).astype(np.int32), "weight": np.ones(ROWS, np.float32)}
            for _ in range(count)]


def train(spec: ModelSpec, mesh: dict, batches: list, optimizer: OptimizerSpec = OPTIMIZER):
    """Losses of one step per batch on 8 devices laid out as `mesh`, the final portable state and the backend."""
    jax_backend = backend(8, mesh=mesh)
    state = jax_backend.init(spec, optimizer)
    state, losses = jax_backend.train_steps(state, batches, [LEARNING_RATE] * len(batches))
    return np.array(losses), jax_backend.state_to_arrays(state), jax_backend, state


ROUNDING_SHARE = 1e-4
"""The share of parameter elements that may end more than 1e-5 from the replicated run's. Sharding changes only
the order of float sums (a reduce-scatter over fsdp instead of one all-reduce), but Adam turns a gradient that is
rounding noise into a step of up to the learning rate whatever its size, so a few elements whose gradient is ~0
move apart: 3 of 426,624 in the Llama after 20 steps (max 1.9e-5), as 8 replicas and 1 device of today's data
parallelism do (5 of 426,624, max 2.7e-5), measured 2026-11-26 (docs/sharding.md)."""


def check_same_numbers(spec: ModelSpec, mesh: dict, batches: list, optimizer: OptimizerSpec = OPTIMIZER) -> Any:
    """Losses within 1e-5 relative of the replicated run's, and the final state within 1e-5 (all but
    ROUNDING_SHARE of the elements, none further than 2 learning rates a step); returns the sharded run's state."""
    expected_losses, expected, _, _ = train(spec, REPLICATED, batches, optimizer)
    losses, arrays, _, state = train(spec, mesh, batches, optimizer)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    assert arrays.step == expected.step == len(batches)
    apart = total = 0
    for name, value in {**expected.params, **expected.buffers}.items():
        given = {**arrays.params, **arrays.buffers}[name]
        distance = np.abs(given.astype(np.float64) - value)
        assert distance.max() <= 2 * LEARNING_RATE * len(batches), name
        apart, total = apart + np.count_nonzero(distance > 1e-5), total + value.size
    assert apart <= ROUNDING_SHARE * total, (apart, total)
    return state


@pytest.mark.parametrize("steps", [pytest.param(5, id="fast"), pytest.param(20, id="full", marks=pytest.mark.long)])
@pytest.mark.parametrize("mesh", [{"data": 2, "fsdp": 4}, {"data": 2, "fsdp": 2, "tensor": 2}], ids=str)
def test_llama_sharded_trains_as_replicated(tmp_path, mesh, steps) -> None:
    check_same_numbers(llama_spec(tmp_path / "llama"), mesh, token_batches(steps))


def test_gemma2_sharded_over_fsdp_trains_as_replicated(tmp_path) -> None:
    check_same_numbers(llama_spec(tmp_path / "gemma2", GEMMA2), {"data": 2, "fsdp": 4}, token_batches(5))


def test_lora_over_a_sharded_frozen_base_trains_as_replicated(tmp_path) -> None:
    """LoRA on every projection of a base split over fsdp = 4: the same numbers as replicated, the base's weights
    held as shards (a quarter of each large one a device) and never changed, moments of the adapters alone."""
    base = llama_spec(tmp_path / "llama")
    spec = with_adapters(base, Lora.read({"rank": 8, "targets": ["q_proj", "v_proj", "up_proj", "down_proj"]},
                                         base.family, base.arch), seed=2)
    check_same_numbers(spec, {"data": 2, "fsdp": 4}, token_batches(5))
    _, arrays, _, state = train(spec, {"data": 2, "fsdp": 4}, token_batches(2))
    assert set(arrays.exp_avg) == set(spec.params) - spec.frozen
    for name in spec.frozen:
        np.testing.assert_array_equal(arrays.params[name], spec.params[name])
    down = state.frozen["block.0.down.weight"]  # the flat tree of canonical names, portable layout
    assert down.addressable_shards[0].data.size == down.size // 4


def test_a_network_written_once_sharded_over_fsdp_trains_as_replicated() -> None:
    """A network of your own (`tpuplex.nn`, tests/common/written_once.py) is laid out from its parameters' names
    and shapes alone: its feed-forward weights split over fsdp = 2, the rest whole."""
    spec = network_classifier_spec("written_once:AttentionPool", 2, user_model_checks.VOCAB, dropout=False)
    state = check_same_numbers(spec, {"data": 4, "fsdp": 2}, user_model_checks.batches(5))
    up = state.params["block.up.weight"]
    assert up.addressable_shards[0].data.size == up.size // 2


@pytest.mark.parametrize("steps", [pytest.param(5, id="fast"), pytest.param(20, id="full", marks=pytest.mark.long)])
def test_resnet_with_batch_norm_sharded_trains_as_replicated(tmp_path, steps) -> None:
    spec = image_family_spec(write_config(tmp_path / "resnet", RESNET), num_labels=3, dropout=False)
    check_same_numbers(spec, {"data": 2, "fsdp": 4}, image_batches(steps), OptimizerSpec(grad_accum=2, seed=1))


def test_each_device_holds_an_eighth_of_the_state(tmp_path) -> None:
    """fsdp = 8: the parameters and both moments on each device add up to 1/8 of the whole (within 1.1x: the norms,
    too small to split, stay whole), as the core's layouts say. A Llama wide enough for its key and value
    projections to be split too (the narrower one keeps them whole: `tpuplex.sharding.MIN_SHARDED_ELEMENTS`)."""
    wide = {**LLAMA, "hidden_size": 256, "intermediate_size": 512}
    spec = llama_spec(tmp_path / "llama", wide)
    _, arrays, jax_backend, state = train(spec, {"fsdp": 8}, token_batches(1))
    whole = 3 * sum(array.nbytes for array in arrays.params.values())
    held = jax_backend.state_bytes(state)
    layouts = sharding.layouts({name: a.shape for name, a in arrays.params.items()}, sharding.Mesh(1, 8, 1))
    expected = 3 * sum(sharding.shard_bytes(arrays.params[name].shape, layout, sharding.Mesh(1, 8, 1))
                       for name, layout in layouts.items())
    assert held == expected
    assert held <= 1.1 * whole / 8, (held, whole)


def sliced(step_dir: Path) -> bool:
    """Whether a checkpoint's model file holds slices of its arrays rather than whole ones."""
    with safe_open(step_dir / "model.safetensors", framework="np") as weights:
        return checkpoint.SLICES_METADATA in (weights.metadata() or {})


def test_a_checkpoint_moves_between_meshes(tmp_path) -> None:
    """A checkpoint written as the slices of fsdp = 4 (no array gathered) restores on a replicated mesh and on
    tensor = 2, each device reading its blocks, and they continue alike."""
    spec = llama_spec(tmp_path / "llama")
    batches = token_batches(4)
    _, _, writer, state = train(spec, {"data": 2, "fsdp": 4}, batches[:2])
    written = checkpoint.save(tmp_path / "checkpoints", writer.state_to_slices(state), {}, keep=1)
    assert sliced(written)
    continued = []
    for mesh in (REPLICATED, {"fsdp": 4, "tensor": 2}):
        jax_backend = backend(8, mesh=mesh)
        stored, _ = checkpoint.load(written)
        state = jax_backend.state_from_arrays(jax_backend.init(spec, OPTIMIZER), stored)
        state, losses = jax_backend.train_steps(state, batches[2:], [LEARNING_RATE] * 2)
        continued.append(np.array(losses))
    np.testing.assert_allclose(continued[1], continued[0], rtol=1e-5)


def test_a_kill_inside_a_sharded_checkpoint_write_resumes_as_the_uninterrupted_run(shared_text, tmp_path) -> None:
    """SIGKILL while a data = 2 x fsdp = 4 run writes its second checkpoint's slices: the same command resumes from
    the first and ends bit for bit as the run never killed."""
    config = write_llama_run(tmp_path, shared_text, steps=4, checkpoint_every=2)
    killed, whole = tmp_path / "killed", tmp_path / "whole"

    def argv(output_dir: Path) -> list[str]:
        return train_args(config, "jax", output_dir, "runtime.mesh={data = 2, fsdp = 4}")

    process = slow_run.start(argv(killed), tmp_path, JAX, hold_write=2)
    slow_run.wait_for(tmp_path / "writing", process, timeout=300)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    assert [p.name for p in checkpoint.checkpoints(killed / "checkpoints")] == ["step-00000002"]
    assert sliced(killed / "checkpoints" / "step-00000002")
    for output_dir in (killed, whole):
        process = slow_run.start(argv(output_dir), tmp_path, JAX)
        _, stderr = process.communicate()
        assert process.returncode == 0, stderr[-3000:]
    assert json.loads((killed / "results.json").read_text())["resumed_from"].endswith("step-00000002")
    slow_run.assert_same_final_state(killed, whole)

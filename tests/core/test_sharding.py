"""The device mesh and the layout of each parameter (`tpuplex.sharding`): decided in the core, the same for every
backend."""

from __future__ import annotations

import pytest

from tpuplex import config, models, registry, sharding
from tpuplex.data.batching import check_micro_batches
from tpuplex.errors import MeshError, TpuplexError
from tpuplex.sharding import Mesh


@pytest.mark.parametrize(("request_", "devices", "expected"), [
    ({}, 8, Mesh(8, 1, 1)),
    ({"fsdp": 4}, 8, Mesh(2, 4, 1)),
    ({"data": -1, "fsdp": 4}, 8, Mesh(2, 4, 1)),
    ({"data": 2, "fsdp": -1}, 8, Mesh(2, 4, 1)),
    ({"data": 1, "fsdp": 2, "tensor": 2}, 4, Mesh(1, 2, 2)),
    ({"data": 4}, 4, Mesh(4, 1, 1)),
])
def test_a_mesh_fills_its_devices(request_, devices, expected) -> None:
    assert sharding.resolve(request_, devices) == expected


@pytest.mark.parametrize(("request_", "devices", "message"), [
    ({"fsdp": 3}, 8, "the other axes' 3 does not divide them"),
    ({"data": 2, "fsdp": 2}, 8, "its axes multiply to 4"),
])
def test_a_mesh_that_does_not_fit_is_refused(request_, devices, message) -> None:
    with pytest.raises(TpuplexError, match=message):
        sharding.resolve(request_, devices)


@pytest.mark.parametrize(("text", "message"), [
    ("{model = 2}", "has the axis 'model': the axes are data, fsdp, tensor"),
    ("{fsdp = 0}", "runtime.mesh.fsdp = 0 is not allowed"),
    ("{fsdp = 1.5}", "runtime.mesh.fsdp = 1.5 is not allowed"),
    ("{data = -1, fsdp = -1}", "more than one -1"),
    ("4", "runtime.mesh = 4 is not allowed: use a table"),
])
def test_a_bad_mesh_in_the_config_is_one_line(text, message) -> None:
    with pytest.raises(TpuplexError, match=message):
        config.load(None, [f"runtime.mesh={text}"])


def test_a_mesh_that_does_not_fit_is_a_mesh_error_with_the_backend_s_fix() -> None:
    with pytest.raises(MeshError, match=r"\(its axes multiply to 4\): make the axes multiply") as caught:
        sharding.resolve({"fsdp": 4, "data": 1}, 2)
    assert caught.value.problem == "runtime.mesh = {'fsdp': 4, 'data': 1} does not fit the 2 device(s) of this run " \
                                   "(its axes multiply to 4)"
    with pytest.raises(MeshError, match=r"does not divide them\): launch 2 processes$"):
        sharding.resolve({"fsdp": 2}, 3, "launch {wanted} processes")


def test_a_batch_that_does_not_split_over_the_mesh_names_its_fsdp_shards() -> None:
    with pytest.raises(TpuplexError, match=r"train.global_batch = 12 does not divide by the 8 batch shards "
                                           r"\(runtime.mesh data = 2 x fsdp = 4: each fsdp shard takes rows of its "
                                           r"own\): use a "
                                           r"multiple of 8, such as 8, 16, 32, 64"):
        check_micro_batches(12, 8, 1, Mesh(2, 4, 1))
    with pytest.raises(TpuplexError, match=r"does not divide by the 8 replicas: use"):
        check_micro_batches(12, 8, 1, Mesh(8, 1, 1))


def test_the_mesh_does_not_change_the_experiment() -> None:
    """A checkpoint resumes on another mesh, so the mesh is not part of the config hash."""
    assert config.load(None, ["runtime.mesh={fsdp = 4}"]).hash() == config.load(None).hash()


def test_fsdp_splits_the_largest_dimension_it_divides() -> None:
    mesh = Mesh(2, 4, 1)
    # 4 does not divide BERT's 30,522 words: the hidden dimension is split instead
    assert sharding.layout("bert.embeddings.word_embeddings.weight", (30522, 384), mesh) == (None, "fsdp")
    assert sharding.layout("bert.embeddings.word_embeddings.weight", (30520, 384), mesh) == ("fsdp", None)
    assert sharding.layout("model.layers.0.mlp.down_proj.weight", (576, 1536), mesh) == (None, "fsdp")
    assert sharding.layout("model.layers.0.self_attn.q_proj.weight", (576, 576), mesh) == ("fsdp", None)
    assert sharding.layout("model.layers.0.input_layernorm.weight", (576,), mesh) == (None,)  # too small
    assert sharding.layout("a.conv.weight", (64, 64, 3, 3), mesh) == ("fsdp", None, None, None)
    assert sharding.layout("model.layers.0.self_attn.q_proj.weight", (576, 576), Mesh(8, 1, 1)) == (None, None)


def test_tensor_splits_attention_and_mlp_as_megatron_does() -> None:
    """Each family's roles (over canonical names) give the dimension a weight splits in its own layout: the
    projections into heads and the MLP their outputs, the projections back their inputs; GPT-2's [in, out] Conv1D
    weights the other way round from Llama's and BERT's [out, in]."""
    llama = {"model_type": "llama", "vocab_size": 64, "hidden_size": 576, "intermediate_size": 1536,
             "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 64}
    gpt2 = {"model_type": "gpt2", "vocab_size": 64, "n_embd": 576, "n_layer": 1, "n_head": 4, "n_positions": 64}
    bert = {"model_type": "bert", "vocab_size": 64, "hidden_size": 384, "intermediate_size": 1536,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64}
    dims = {}
    for hf_config in (llama, gpt2, bert):
        family, arch = models.architecture_of(hf_config)
        dims |= family.tensor_dims(arch)
    shapes = {"model.layers.0.self_attn.q_proj.weight": (576, 576),
              "model.layers.0.self_attn.o_proj.weight": (576, 576), "model.layers.0.mlp.up_proj.weight": (1536, 576),
              "transformer.h.0.attn.c_attn.weight": (576, 1728), "transformer.h.0.mlp.c_proj.weight": (2304, 576),
              "bert.encoder.layer.1.output.dense.weight": (384, 1536),
              "bert.encoder.layer.1.attention.self.query.weight": (384, 384), "model.norm.weight": (576,)}
    assert sharding.layouts(shapes, Mesh(1, 2, 2), dims) == {
        "model.layers.0.self_attn.q_proj.weight": ("tensor", "fsdp"),
        "model.layers.0.self_attn.o_proj.weight": ("fsdp", "tensor"),
        "model.layers.0.mlp.up_proj.weight": ("tensor", "fsdp"),
        "transformer.h.0.attn.c_attn.weight": ("fsdp", "tensor"),
        "transformer.h.0.mlp.c_proj.weight": ("tensor", "fsdp"),
        "bert.encoder.layer.1.output.dense.weight": ("fsdp", "tensor"),
        "bert.encoder.layer.1.attention.self.query.weight": ("tensor", "fsdp"),
        "model.norm.weight": (None,)}


def test_shard_bytes_divide_by_the_axes_that_split() -> None:
    mesh = Mesh(1, 2, 2)
    assert sharding.shard_bytes((576, 576), ("tensor", "fsdp"), mesh) == 4 * 576 * 576 // 4
    assert sharding.shard_bytes((576,), (None,), mesh) == 4 * 576


def test_a_backend_that_does_not_shard_refuses_a_sharded_mesh_in_one_line(monkeypatch) -> None:
    class DataOnly:
        name = "tf"

    class EntryPoint:
        name = "tf"

        @staticmethod
        def load():
            return DataOnly

    monkeypatch.setattr(registry, "entry_points", lambda group: [EntryPoint()])
    runtime = config.load(None, ["runtime.mesh={data = -1, fsdp = 4}"]).runtime
    with pytest.raises(TpuplexError, match="the tf backend does not do .*--backend jax"):
        registry.create("tf", runtime)

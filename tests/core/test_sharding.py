"""The device mesh and the layout of each parameter (`tpuplex.sharding`): decided in the core, the same for every
backend."""

from __future__ import annotations

import pytest

from tpuplex import config, registry, sharding
from tpuplex.errors import TpuplexError
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
    mesh = Mesh(1, 2, 2)
    assert sharding.layout("model.layers.0.self_attn.q_proj.weight", (576, 576), mesh) == ("tensor", "fsdp")
    assert sharding.layout("model.layers.0.self_attn.o_proj.weight", (576, 576), mesh) == ("fsdp", "tensor")
    assert sharding.layout("model.layers.0.mlp.up_proj.weight", (1536, 576), mesh) == ("tensor", "fsdp")
    assert sharding.layout("bert.encoder.layer.1.output.dense.weight", (384, 1536), mesh) == ("fsdp", "tensor")
    assert sharding.layout("bert.encoder.layer.1.attention.self.query.weight", (384, 384), mesh) == ("tensor", "fsdp")


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

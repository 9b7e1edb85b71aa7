"""Text encoder families in Flax: the parameters as a flat tree under their canonical names in the portable layout,
run by the encoder written once (`tpuplex.models.encoder.forward`) and the task's head
(`tpuplex.tasks.base.Head.forward`) over jax's table of operations (`tpuplex_jax.ops.JaxOps`).

Linen rather than NNX: the training step is a pure function of a parameter pytree (`model.apply(params, ...)`),
which is what `jax.jit`, `jax.grad` and optax consume directly, with no split/merge of module state.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

import jax
from tpuplex.checkpoints import check_names
from tpuplex.kinds.text import expected_shapes
from tpuplex.models import encoder
from tpuplex.models.encoder_architecture import Architecture
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex.tasks.base import Head
from tpuplex_jax.kinds import Built, KindModule
from tpuplex_jax.ops import JaxOps, Naming, flax_views


class EncoderModel(nn.Module):
    """input_ids, token_type_ids, attention_mask int32 [B, L] (and the head's inputs) -> the head's outputs.
    shapes: (canonical name, portable shape) of every parameter; dtype: the compute dtype (float32, or bfloat16
    with float32 parameters)."""

    arch: Architecture
    head: Head
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array, attention_mask: jax.Array,
                 deterministic: bool = True, **head_inputs: jax.Array) -> Any:
        params = {name: self.param(name, nn.initializers.zeros, shape) for name, shape in self.shapes}
        ops = JaxOps(self, deterministic, self.dtype)
        hidden = encoder.forward(ops, params, self.arch, input_ids, token_type_ids, attention_mask)
        return self.head.forward(ops, params, hidden, **head_inputs)


class TextEncoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec, batch_shards: int) -> Built:
        dtype = jnp.bfloat16 if optimizer.bf16 else jnp.float32
        arch, head = (spec.arch, spec.head) if spec.dropout else (spec.arch.without_dropout(),
                                                                  spec.head.without_dropout())
        names = {**spec.family.hf_names(arch), **{name: head.hf_name(name) for name in head.shapes}}
        shapes = expected_shapes(spec.hf_config, head)
        check_names(shapes, spec.params, "model.params")
        naming = Naming(names, torch_layout=False)
        network = EncoderModel(arch, head, tuple((name, shapes[hf]) for name, hf in names.items()), dtype)
        template = {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in network.shapes}
        return Built(network, flax_views(spec.params, template, naming), {}, naming, Naming.native({}),
                     arch.max_length)

"""The speech families in Flax: the parameters under their names, run by the forward pass written once
(`tpuplex.models.conformer.forward`) over jax's table of operations (`tpuplex_jax.ops.JaxOps`)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

import jax
from tpuplex.models.conformer import ConformerArch, forward
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_jax.kinds import Built, KindModule
from tpuplex_jax.ops import JaxOps, Naming, flax_views


class SpeechModel(nn.Module):
    """(features float32 [B, T, mel], attention_mask [B, T]) -> (logits [B, T', vocab], output_lengths [B])."""

    arch: ConformerArch
    shapes: tuple[tuple[str, tuple[int, ...]], ...]

    @nn.compact
    def __call__(self, features: jax.Array, attention_mask: jax.Array, deterministic: bool = True) -> tuple:
        params = {name: self.param(name, nn.initializers.zeros, shape) for name, shape in self.shapes}
        lengths = attention_mask.sum(axis=1)
        logits = forward(JaxOps(self, deterministic), params, self.arch, features, lengths)
        return logits, self.arch.output_frames(lengths)


class SpeechFamily(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec, batch_shards: int) -> Built:
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        network = SpeechModel(arch, tuple((name, tuple(np.shape(array))) for name, array in spec.params.items()))
        naming = Naming({name: name for name in spec.params})
        template = {name: jax.ShapeDtypeStruct(np.shape(array), jnp.float32) for name, array in spec.params.items()}
        return Built(network, flax_views(spec.params, template, naming), {}, naming, Naming.native({}),
                     np.iinfo(np.int32).max)

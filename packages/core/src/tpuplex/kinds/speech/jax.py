"""The speech families in Flax: the parameters under their names, and the operations the forward pass
(`tpuplex.models.conformer.forward`) is written over."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

import jax
from tpuplex.kinds.jax import Built, KindModule
from tpuplex.layers.jax import Naming, flax_views
from tpuplex.models.conformer import ConformerArch, forward, positions
from tpuplex.protocol import ModelSpec, OptimizerSpec


class JaxOps:
    """`tpuplex.models.conformer.Ops` in jax; dropout from the module's "dropout" generator unless
    `deterministic`."""

    def __init__(self, module: nn.Module, deterministic: bool):
        self.module, self.deterministic = module, deterministic

    relu = staticmethod(jax.nn.relu)
    silu = staticmethod(jax.nn.silu)
    sigmoid = staticmethod(jax.nn.sigmoid)
    where = staticmethod(jnp.where)
    einsum = staticmethod(jnp.einsum)
    reshape = staticmethod(jnp.reshape)
    transpose = staticmethod(jnp.transpose)

    def linear(self, x, weight, bias):
        return x @ weight.T + bias

    def conv2d(self, x, weight, bias, stride):
        out = jax.lax.conv_general_dilated(x, weight, (stride, stride), "VALID",
                                           dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return out + bias[None, :, None, None]

    def depthwise_conv1d(self, x, weight, bias):
        half = weight.shape[-1] // 2
        out = jax.lax.conv_general_dilated(x, weight, (1,), [(half, half)], dimension_numbers=("NWC", "OIW", "NWC"),
                                           feature_group_count=weight.shape[0])
        return out + bias

    def layer_norm(self, x, weight, bias, eps):
        mean = x.mean(axis=-1, keepdims=True)
        variance = jnp.square(x - mean).mean(axis=-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(variance + eps) * weight + bias

    def softmax(self, x):
        return jax.nn.softmax(x, axis=-1)

    def shape(self, x):
        return x.shape

    def constant(self, array: np.ndarray):
        return jnp.asarray(array)

    def positions(self, frames, width):
        return self.constant(positions(frames, width))

    def dropout(self, x, rate, site):
        return nn.Dropout(rate)(x, deterministic=self.deterministic) if rate else x

    def frame_mask(self, lengths, frames):
        return (jnp.arange(frames)[None, :] < lengths[:, None]).astype(jnp.float32)


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

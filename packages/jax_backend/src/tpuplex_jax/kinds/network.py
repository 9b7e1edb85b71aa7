"""The generic holder of a network written once (`tpuplex.nn.Network`: a network of your own, the Conformer) in
Flax: its parameters a flat tree under their portable names (and layout), its forward pass run over `JaxOps`."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

import jax
from tpuplex.nn import Network
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_jax.kinds import Built, KindModule
from tpuplex_jax.ops import JaxOps, Naming, flax_views


class NetworkHolder(nn.Module):
    """`network`'s parameters (name, shape) as a Flax module's; dropout drawn in training when `dropout`."""

    network: Network
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    dropout: bool

    @nn.compact
    def __call__(self, *inputs: jax.Array, deterministic: bool = True, train: bool = False) -> Any:
        # `train` (an image task's batch statistics) switches nothing here: the op table keeps no moving state.
        params = {name: self.param(name, nn.initializers.zeros, shape) for name, shape in self.shapes}
        return self.network(JaxOps(self, deterministic or not self.dropout), params, *inputs)


class NetworkModule(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec, batch_shards: int) -> Built:
        """The holder, traced once on the task's example batch (what checks a network of your own's output)."""
        shapes = tuple((name, tuple(np.shape(array))) for name, array in spec.params.items())
        holder = NetworkHolder(spec.kind.network(spec), shapes, spec.dropout)
        naming = Naming({name: name for name in spec.params})
        template = {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in shapes}
        args, kwargs = task.model_inputs(dict(spec.example_batch), False, False)
        jax.eval_shape(lambda p: holder.apply({"params": p}, *args, **kwargs), template)
        return Built(holder, flax_views(spec.params, template, naming), {}, naming, Naming.native({}),
                     np.iinfo(np.int32).max)

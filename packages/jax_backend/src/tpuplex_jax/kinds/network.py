"""The generic holder of a network written once (`tpuplex.nn.Network`) in Flax: its parameters a flat tree under the
names it declares (the portable names and layout), its forward pass run over `JaxOps`."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

import jax
from tpuplex.models import user
from tpuplex.nn import Network
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_jax.kinds import Built, KindModule
from tpuplex_jax.ops import JaxOps, Naming, flax_views


class NetworkHolder(nn.Module):
    """`network`'s parameters (name, shape) as a Flax module's; dropout drawn in training when `dropout`."""

    network: Network
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    dropout: bool
    compute_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, *inputs: jax.Array, deterministic: bool = True, train: bool = False) -> Any:
        # `train` (an image task's batch statistics) has nothing to switch here: the op table keeps no moving state.
        params = {name: self.param(name, nn.initializers.zeros, shape) for name, shape in self.shapes}
        ops = JaxOps(self, deterministic or not self.dropout, self.compute_dtype)
        return self.network(ops, params, *inputs)


class NetworkModule(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec, batch_shards: int) -> Built:
        """The holder, checked to return logits [rows, num_labels] for the task's example batch (traced only)."""
        network = user.build(spec.architecture, "", spec.model_arguments, Network, "tpuplex.nn.Network")
        shapes = tuple((name, tuple(np.shape(array))) for name, array in spec.params.items())
        holder = NetworkHolder(network, shapes, spec.dropout, jnp.bfloat16 if optimizer.bf16 else jnp.float32)
        naming = Naming({name: name for name in spec.params})
        template = {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in shapes}
        args, kwargs = task.model_inputs(dict(spec.example_batch), False, False)
        logits = jax.eval_shape(lambda p: holder.apply({"params": p}, *args, **kwargs), template)
        user.check_logits(spec.architecture, tuple(logits.shape), len(spec.example_batch["labels"]), spec.num_labels)
        return Built(holder, flax_views(spec.params, template, naming), {}, naming, Naming.native({}),
                     np.iinfo(np.int32).max)

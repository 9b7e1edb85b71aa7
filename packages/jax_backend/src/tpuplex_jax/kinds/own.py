"""Your own Flax module (`model.architecture`, `tpuplex.models.user`), initialised from the optimizer's seed."""

from __future__ import annotations

import flax.linen as nn
import numpy as np

import jax
from tpuplex.models import user
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_jax.kinds import Built, KindModule
from tpuplex_jax.ops import Naming


class OwnModel(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec, batch_shards: int) -> Built:
        """The user's Flax module, its parameters and other collections (batch statistics) from `init` with
        `optimizer.seed`, after checking it returns logits [rows, num_labels]."""
        module = user.build(spec.architecture, "jax", spec.model_arguments, nn.Module, "flax.linen.Module")
        args, kwargs = task.model_inputs(dict(spec.example_batch), False, False)
        variables = dict(jax.device_get(module.init(jax.random.key(optimizer.seed), *args, **kwargs)))
        params = variables.pop("params")
        logits = jax.eval_shape(lambda p: module.apply({"params": p, **variables}, *args, **kwargs), params)
        shape = tuple(logits.shape) if isinstance(logits, jax.ShapeDtypeStruct) else type(logits).__name__
        user.check_logits(spec.architecture, shape, len(spec.example_batch["labels"]), spec.num_labels)
        return Built(module, params, variables, Naming.native(params), Naming.native(variables),
                     np.iinfo(np.int32).max)

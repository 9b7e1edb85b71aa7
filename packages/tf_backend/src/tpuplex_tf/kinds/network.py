"""The generic holder of a network written once (`tpuplex.nn.Network`: a network of your own, the Conformer) in
Keras: its parameters as variables under their portable names, its forward pass run over `TfOps`."""

from __future__ import annotations

from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

from tpuplex.nn import Network
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_tf.kinds import Built, KindModule
from tpuplex_tf.ops import TfOps, Variables


class NetworkHolder(keras.Model):
    """`network`'s parameters as the model's variables; dropout drawn from the step's seed when `dropout`."""

    def __init__(self, network: Network, shapes: Mapping[str, tuple[int, ...]], dropout: bool, **kwargs):
        super().__init__(**kwargs)
        self.network, self.dropout = network, dropout
        self.named = {name: self.add_weight(shape=shape, initializer="zeros", name=name.replace(".", "_"))
                      for name, shape in shapes.items()}

    def call(self, *inputs: tf.Tensor, seed: tf.Tensor | None = None):
        ops = TfOps(seed if self.dropout else None)
        return self.network(ops, {name: variable.value for name, variable in self.named.items()}, *inputs)

    def hf_variables(self) -> Variables:
        return {name: (variable, False) for name, variable in self.named.items()}

    def state_variables(self) -> dict[str, keras.Variable]:
        return {}


class NetworkModule(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        """The holder, called once on the task's example batch: every variable created, as Keras' export asks."""
        model = NetworkHolder(spec.kind.network(spec), {name: tuple(np.shape(array))
                                                         for name, array in spec.params.items()}, spec.dropout)
        model(*task.model_inputs({key: tf.constant(value) for key, value in spec.example_batch.items()}))
        return Built(model, spec.params, {})

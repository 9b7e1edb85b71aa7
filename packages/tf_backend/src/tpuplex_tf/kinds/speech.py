"""The speech families in Keras (TensorFlow): the parameters as variables under their names, run by the forward pass
written once (`tpuplex.models.conformer.forward`) over TensorFlow's table of operations (`tpuplex_tf.ops.TfOps`)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tpuplex.models.conformer import ConformerArch, forward
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_tf.kinds import Built, KindModule
from tpuplex_tf.ops import TfOps, Variables


class SpeechModel(keras.Model):
    """(features float32 [B, T, mel], attention_mask [B, T]) -> (logits [B, T', vocab], output_lengths [B])."""

    def __init__(self, arch: ConformerArch, shapes: dict[str, tuple[int, ...]], **kwargs):
        super().__init__(**kwargs)
        self.arch = arch
        self.named = {name: self.add_weight(shape=shape, initializer="zeros", name=name.replace(".", "_"))
                      for name, shape in shapes.items()}

    def call(self, features, attention_mask, seed: tf.Tensor | None = None):
        lengths = tf.reduce_sum(tf.cast(attention_mask, tf.int32), axis=1)
        logits = forward(TfOps(seed), {name: v.value for name, v in self.named.items()}, self.arch, features,
                         lengths)
        return logits, self.arch.output_frames(lengths)

    def hf_variables(self) -> Variables:
        return {name: (variable, False) for name, variable in self.named.items()}

    def state_variables(self) -> dict[str, keras.Variable]:
        return {}


class SpeechFamily(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        model = SpeechModel(arch, {name: tuple(np.shape(array)) for name, array in spec.params.items()})
        model(spec.example_batch["features"], spec.example_batch["attention_mask"])  # built, as Keras' export asks
        return Built(model, spec.params, {})

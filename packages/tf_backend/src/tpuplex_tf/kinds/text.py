"""Text encoder families in Keras (TensorFlow): the parameters as variables under their HF names in the portable
layout, run by the encoder written once (`tpuplex.models.encoder.forward`) and the task's head
(`tpuplex.tasks.base.Head.forward`) over TensorFlow's table of operations (`tpuplex_tf.ops.TfOps`), dropout
stateless from `seed`.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tpuplex.errors import TpuplexError
from tpuplex.kinds.text import expected_shapes
from tpuplex.models import encoder
from tpuplex.models.encoder_architecture import Architecture
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex.tasks.base import Head
from tpuplex_tf.kinds import Built, KindModule
from tpuplex_tf.ops import TfOps, Variables


class EncoderModel(keras.Model):
    """(input_ids, token_type_ids, attention_mask) int32 [B, L] (and the head's inputs) -> the head's outputs."""

    def __init__(self, arch: Architecture, head: Head, names: dict[str, str], shapes: dict[str, tuple[int, ...]],
                 **kwargs):
        """names: canonical -> HF name of every parameter (encoder and head); shapes: HF name -> portable shape."""
        super().__init__(**kwargs)
        self.arch, self.head_spec, self.names = arch, head, names
        self.named = {name: self.add_weight(shape=shapes[hf], initializer="zeros", name=hf.replace(".", "_"))
                      for name, hf in names.items()}

    def call(self, input_ids, token_type_ids, attention_mask, seed: tf.Tensor | None = None,
             **head_inputs: tf.Tensor) -> tf.Tensor:
        """The head's outputs; `seed` (int32 [2]) turns dropout on (rates are 0 when built without it)."""
        params = {name: variable.value for name, variable in self.named.items()}
        ops = TfOps(seed, tf.as_dtype(self.compute_dtype))
        hidden = encoder.forward(ops, params, self.arch, input_ids, token_type_ids, attention_mask)
        return self.head_spec.forward(ops, params, hidden, **head_inputs)

    def state_variables(self) -> dict[str, keras.Variable]:
        """The encoder and its heads have no non-trainable state."""
        return {}

    def hf_variables(self) -> Variables:
        """HF parameter name -> (Keras variable, not transposed: every variable keeps the portable layout)."""
        return {self.names[name]: (variable, False) for name, variable in self.named.items()}


class TextEncoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        """Create the model and its variables (called under the strategy's scope, so they are distributed)."""
        if optimizer.bf16:
            raise TpuplexError("train.bf16 = true is supported by the tf backend for the image families (ResNet, "
                               "ViT) only so far: set train.bf16 = false (or use the jax or torch backend)")
        arch, head = (spec.arch, spec.head) if spec.dropout else (spec.arch.without_dropout(),
                                                                  spec.head.without_dropout())
        names = {**spec.family.hf_names(arch), **{name: head.hf_name(name) for name in head.shapes}}
        model = EncoderModel(arch, head, names, expected_shapes(spec.hf_config, head))
        ones = tf.ones([1, 2], tf.int32)
        model(ones, ones * 0, ones)  # built, as Keras' export asks
        return Built(model, spec.params, {})

"""Sequence classification in Keras (TensorFlow): the classifier head on the first token, its per-example loss,
and the SavedModel's serving outputs."""

from __future__ import annotations

import keras
import tensorflow as tf

from tpuplex.layers.tf import ACTIVATIONS, Variables, dense_variables, dropout
from tpuplex.models import Architecture
from tpuplex.tasks import tf as tasks_tf
from tpuplex.tasks.sequence_classification.heads import ClassifierHead


class Head(keras.layers.Layer):
    """[dropout] -> dense -> activation -> dropout -> out, on the first token: [B, L, H] -> logits [B, C]."""

    def __init__(self, arch: Architecture, head: ClassifierHead, **kwargs):
        super().__init__(**kwargs)
        self.spec = head
        self.dense = keras.layers.Dense(arch.hidden_size, name="dense")
        self.out = keras.layers.Dense(head.num_labels, name="out")

    def call(self, hidden: tf.Tensor, seed: tf.Tensor | None) -> tf.Tensor:
        first, head = hidden[:, 0], self.spec
        if head.dropout_first:
            first = dropout(first, head.dropout, seed, -2)
        pooled = ACTIVATIONS[head.activation](self.dense(first))
        return self.out(dropout(pooled, head.dropout, seed, -1))

    def canonical_variables(self) -> Variables:
        return {**dense_variables("head.dense", self.dense), **dense_variables("head.out", self.out)}


class Module(tasks_tf.TaskModule):
    def build_head(self, arch: Architecture, head: ClassifierHead, word_embeddings: keras.Variable) -> Head:
        return Head(arch, head, name="head")

    def unit_losses(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """[B] cross-entropy, or squared error when there is one output (logits [B, 1] vs float labels [B])."""
        if outputs.shape[-1] == 1:
            return tf.square(outputs[:, 0] - tf.cast(batch["labels"], outputs.dtype))
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(batch["labels"], tf.int32),
                                                              logits=outputs)

    def predict_outputs(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """Logits float32 [B, C]."""
        return outputs

    def serving_outputs(self, outputs: tf.Tensor) -> dict[str, tf.Tensor]:
        """Logits and probabilities [batch, C] (softmax; for regression the score itself)."""
        probabilities = outputs if outputs.shape[-1] == 1 else tf.nn.softmax(outputs, axis=-1)
        return {"logits": outputs, "probabilities": probabilities}

"""Token classification in Keras (TensorFlow): dropout and a linear classifier on every position, the per-token
loss, and the SavedModel's serving outputs."""

from __future__ import annotations

import keras
import tensorflow as tf

from tpuplex.layers.tf import Variables, dense_variables, dropout
from tpuplex.models import Architecture
from tpuplex.tasks import tf as tasks_tf
from tpuplex.tasks.token_classification.heads import TokenClassifierHead


class Head(keras.layers.Layer):
    """dropout -> out: [B, L, H] -> logits [B, L, T]."""

    def __init__(self, head: TokenClassifierHead, **kwargs):
        super().__init__(**kwargs)
        self.spec = head
        self.out = keras.layers.Dense(head.num_labels, name="out")

    def call(self, hidden: tf.Tensor, seed: tf.Tensor | None) -> tf.Tensor:
        return self.out(dropout(hidden, self.spec.dropout, seed, -1))

    def canonical_variables(self) -> Variables:
        return dense_variables("head.out", self.out)


class Module(tasks_tf.TaskModule):
    def build_head(self, arch: Architecture, head: TokenClassifierHead, word_embeddings: keras.Variable) -> Head:
        return Head(head, name="head")

    def unit_losses(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """Per-token cross-entropy [B, L] of logits [B, L, T] against the tag ids."""
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(batch["labels"], tf.int32),
                                                              logits=outputs)

    def predict_outputs(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """Logits float32 [B, L, T]."""
        return outputs

    def serving_outputs(self, outputs: tf.Tensor) -> dict[str, tf.Tensor]:
        """Logits and probabilities [batch, length, tags]."""
        return {"logits": outputs, "probabilities": tf.nn.softmax(outputs, axis=-1)}

"""Token classification in Keras (TensorFlow): the per-token loss and the SavedModel's serving outputs (the head is
`TokenClassifierHead.forward`, written once)."""

from __future__ import annotations

import tensorflow as tf

from tpuplex_tf import tasks as tasks_tf


class Module(tasks_tf.TaskModule):
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

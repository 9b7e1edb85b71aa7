"""Sequence classification in Keras (TensorFlow): the per-example loss and the SavedModel's serving outputs (the
head is `ClassifierHead.forward`, written once)."""

from __future__ import annotations

import tensorflow as tf

from tpuplex_tf import tasks as tasks_tf


class Module(tasks_tf.TaskModule):
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

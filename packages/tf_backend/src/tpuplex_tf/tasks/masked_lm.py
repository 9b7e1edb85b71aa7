"""Masked-LM pre-training in Keras (TensorFlow): the cross-entropy of the masked positions (the head is
`MaskedLMHead.forward`, written once: the decoder tied to the word embeddings, on the masked positions only)."""

from __future__ import annotations

import tensorflow as tf

from tpuplex_tf import tasks as tasks_tf


class Module(tasks_tf.TaskModule):
    def unit_losses(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """Per-position cross-entropy [B, P] of logits [B, P, V] against the original ids."""
        return tasks_tf.token_losses(outputs, batch["labels"])

    def predict_outputs(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """float32 [B, P, 2]: each position's cross-entropy and 1.0 where the most likely token is the label."""
        return tasks_tf.token_outputs(outputs, batch["labels"])

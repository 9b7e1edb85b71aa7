"""Causal-LM training in Keras (TensorFlow): the next-token cross-entropy of a decoder's logits
(`tpuplex.kinds.decoder`)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tpuplex_tf import tasks as tasks_tf


class Module(tasks_tf.TaskModule):
    def model_inputs(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, ...]:
        """The decoder's call: input_ids int32 [B, L]."""
        return (batch["input_ids"],)

    def unit_losses(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """Per-token cross-entropy float32 [B, L] of logits [B, L, V] against the next tokens (a chat batch: [B, K],
        its answer targets')."""
        return tasks_tf.token_losses(outputs, batch["labels"])

    def predict_outputs(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """float32 [B, L, 2]: each position's cross-entropy and 1.0 where the most likely token is the next one."""
        return tasks_tf.token_outputs(outputs, batch["labels"])

    def serving(self, model: Any, data: Any) -> tasks_tf.Serving:
        """The SavedModel's `serving_default`: input_ids int32 [batch, length] -> next-token logits."""
        def serve(input_ids: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"logits": model(input_ids)}

        return tasks_tf.Serving({"serving_default": (serve, [tf.TensorSpec([None, None], tf.int32,
                                                                            name="input_ids")])})

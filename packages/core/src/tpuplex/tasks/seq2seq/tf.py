"""Text-to-text training in Keras (TensorFlow): the cross-entropy of an encoder-decoder's logits over the target
tokens."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tpuplex.errors import TpuplexError
from tpuplex.models.t5 import INPUTS
from tpuplex.tasks import tf as tasks_tf


class Module(tasks_tf.TaskModule):
    def model_inputs(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, ...]:
        """The model's call: input_ids, attention_mask int32 [B, S], decoder_input_ids [B, T]."""
        return tuple(batch[name] for name in INPUTS)

    def unit_losses(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """Per-target-token cross-entropy [B, T] of logits [B, T, V]."""
        return tasks_tf.token_losses(outputs, batch["labels"])

    def predict_outputs(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """float32 [B, T, 2]: each target token's cross-entropy and 1.0 where it is the most likely token."""
        return tasks_tf.token_outputs(outputs, batch["labels"])

    def serving(self, model: Any, data: Any) -> tuple[Any, list[tf.TensorSpec]]:
        """Refused: T5's relative-position buckets are computed for static lengths, which a SavedModel signature of
        any length does not give (not built yet)."""
        raise TpuplexError("a text-to-text (T5) run has no SavedModel export yet: use tpuplex export RUN --format hf "
                           "(transformers' AutoModelForSeq2SeqLM loads it), or tpuplex predict / generate")

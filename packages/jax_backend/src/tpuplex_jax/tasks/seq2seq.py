"""Text-to-text training in Flax: the cross-entropy of an encoder-decoder's logits over the target tokens."""

from __future__ import annotations

import jax
from tpuplex.models.t5 import INPUTS
from tpuplex_jax import tasks as tasks_jax


class Module(tasks_jax.TaskModule):
    def model_inputs(self, rows: dict[str, jax.Array], train: bool, dropout: bool) -> tuple[tuple, dict]:
        """The model's call: input_ids, attention_mask [b, S], decoder_input_ids [b, T] and `deterministic`."""
        return tuple(rows[name] for name in INPUTS), {"deterministic": not (train and dropout)}

    def unit_losses(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Per-target-token cross-entropy [b, T] of logits [b, T, V]."""
        return tasks_jax.token_losses(outputs, rows["labels"])

    def predict_outputs(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """float32 [b, T, 2]: each target token's cross-entropy and 1.0 where it is the most likely token."""
        return tasks_jax.token_outputs(outputs, rows["labels"])

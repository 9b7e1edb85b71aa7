"""Masked-LM pre-training in Flax: the cross-entropy of the masked positions (the head is `MaskedLMHead.forward`,
written once: the decoder tied to the word embeddings, on the masked positions only)."""

from __future__ import annotations

import jax
from tpuplex_jax import tasks as tasks_jax


class Module(tasks_jax.TaskModule):
    def unit_losses(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Per-position cross-entropy [B, P] of logits [B, P, V] against the original ids."""
        return tasks_jax.token_losses(outputs, rows["labels"])

    def predict_outputs(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """float32 [B, P, 2]: each position's cross-entropy and 1.0 where the most likely token is the label."""
        return tasks_jax.token_outputs(outputs, rows["labels"])

"""Token classification in Flax: the per-token loss (the head is `TokenClassifierHead.forward`, written once)."""

from __future__ import annotations

import optax

import jax
from tpuplex_jax import tasks as tasks_jax


class Module(tasks_jax.TaskModule):
    def unit_losses(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Per-token cross-entropy [B, L] of logits [B, L, T] against the tag ids."""
        return optax.softmax_cross_entropy_with_integer_labels(outputs, rows["labels"])

    def predict_outputs(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Logits float32 [B, L, T]."""
        return outputs

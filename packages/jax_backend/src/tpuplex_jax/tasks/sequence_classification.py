"""Sequence classification in Flax: the per-example loss (the head is `ClassifierHead.forward`, written once)."""

from __future__ import annotations

import jax.numpy as jnp
import optax

import jax
from tpuplex_jax import tasks as tasks_jax


class Module(tasks_jax.TaskModule):
    def unit_losses(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Per-example loss [B]: cross-entropy on logits [B, C] and int labels, or squared error when C == 1."""
        if outputs.shape[-1] == 1:
            return jnp.square(outputs[:, 0] - rows["labels"].astype(jnp.float32))
        return optax.softmax_cross_entropy_with_integer_labels(outputs, rows["labels"])

    def predict_outputs(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Logits float32 [B, C]."""
        return outputs

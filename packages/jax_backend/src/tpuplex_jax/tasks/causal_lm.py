"""Causal-LM training in Flax: the next-token cross-entropy of a decoder's logits (`tpuplex.kinds.decoder`)."""

from __future__ import annotations

import jax
from tpuplex.protocol import head_inputs
from tpuplex_jax import tasks as tasks_jax


class Module(tasks_jax.TaskModule):
    def model_inputs(self, rows: dict[str, jax.Array], train: bool, dropout: bool) -> tuple[tuple, dict]:
        """The decoder's call: input_ids [b, L], `deterministic` and a chat batch's `target_positions` [b, K]."""
        return (rows["input_ids"],), {"deterministic": not (train and dropout), **head_inputs(rows, ("input_ids",))}

    def unit_losses(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Per-token cross-entropy float32 [B, L] of logits [B, L, V] against the next tokens (a chat batch: [B, K],
        its answer targets')."""
        return tasks_jax.token_losses(outputs, rows["labels"])

    def predict_outputs(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """float32 [B, L, 2]: each position's cross-entropy and 1.0 where the most likely token is the next one."""
        return tasks_jax.token_outputs(outputs, rows["labels"])

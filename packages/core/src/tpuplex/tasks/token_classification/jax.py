"""Token classification in Flax: dropout and a linear classifier on every position, and the per-token loss."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import optax

import jax
from tpuplex.models import Architecture
from tpuplex.tasks import jax as tasks_jax
from tpuplex.tasks.token_classification.heads import TokenClassifierHead


class Head(nn.Module):
    """dropout -> out: [B, L, H] -> logits float32 [B, L, T]."""

    num_labels: int
    dropout: float
    dtype: Any

    @nn.compact
    def __call__(self, hidden: jax.Array, word_embeddings: jax.Array, deterministic: bool) -> jax.Array:
        hidden = nn.Dropout(self.dropout)(hidden, deterministic=deterministic)
        return nn.Dense(self.num_labels, dtype=self.dtype, name="out")(hidden).astype(jnp.float32)


class Module(tasks_jax.TaskModule):
    def build_head(self, arch: Architecture, head: TokenClassifierHead, dtype: Any) -> Head:
        return Head(head.num_labels, head.dropout, dtype)

    def unit_losses(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Per-token cross-entropy [B, L] of logits [B, L, T] against the tag ids."""
        return optax.softmax_cross_entropy_with_integer_labels(outputs, rows["labels"])

    def predict_outputs(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Logits float32 [B, L, T]."""
        return outputs

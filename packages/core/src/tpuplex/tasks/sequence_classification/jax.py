"""Sequence classification in Flax: the classifier head on the first token, and its per-example loss."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import optax

import jax
from tpuplex.layers.jax import ACTIVATIONS
from tpuplex.models import Architecture
from tpuplex.tasks import jax as tasks_jax
from tpuplex.tasks.sequence_classification.heads import ClassifierHead


class Head(nn.Module):
    """[dropout] -> dense -> activation -> dropout -> out, on the first token: [B, L, H] -> logits [B, C]."""

    hidden_size: int
    num_labels: int
    activation: str
    dropout_first: bool
    dropout: float
    dtype: Any

    @nn.compact
    def __call__(self, hidden: jax.Array, word_embeddings: jax.Array, deterministic: bool) -> jax.Array:
        first = hidden[:, 0]
        dropout = nn.Dropout(self.dropout)
        if self.dropout_first:
            first = dropout(first, deterministic=deterministic)
        pooled = ACTIVATIONS[self.activation](nn.Dense(self.hidden_size, dtype=self.dtype, name="dense")(first))
        logits = nn.Dense(self.num_labels, dtype=self.dtype, name="out")(dropout(pooled, deterministic=deterministic))
        return logits.astype(jnp.float32)


class Module(tasks_jax.TaskModule):
    def build_head(self, arch: Architecture, head: ClassifierHead, dtype: Any) -> Head:
        return Head(arch.hidden_size, head.num_labels, head.activation, head.dropout_first, head.dropout, dtype)

    def unit_losses(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Per-example loss [B]: cross-entropy on logits [B, C] and int labels, or squared error when C == 1."""
        if outputs.shape[-1] == 1:
            return jnp.square(outputs[:, 0] - rows["labels"].astype(jnp.float32))
        return optax.softmax_cross_entropy_with_integer_labels(outputs, rows["labels"])

    def predict_outputs(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Logits float32 [B, C]."""
        return outputs

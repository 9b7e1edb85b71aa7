"""Sequence classification in Flax: the classifier head on the first token, and its per-example loss."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import optax

import jax
from tpuplex.models import Architecture
from tpuplex.tasks.sequence_classification.heads import ClassifierHead
from tpuplex_jax.model import ACTIVATIONS


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


def head_module(arch: Architecture, head: ClassifierHead, dtype: Any) -> nn.Module:
    return Head(arch.hidden_size, head.num_labels, head.activation, head.dropout_first, head.dropout, dtype)


def unit_losses(outputs: jax.Array, batch: dict[str, jax.Array]) -> jax.Array:
    """Per-example loss [B]: cross-entropy on logits [B, C] and int labels, or squared error when C == 1."""
    if outputs.shape[-1] == 1:
        return jnp.square(outputs[:, 0] - batch["labels"].astype(jnp.float32))
    return optax.softmax_cross_entropy_with_integer_labels(outputs, batch["labels"])


def predict_outputs(outputs: jax.Array, batch: dict[str, jax.Array]) -> jax.Array:
    """Logits float32 [B, C]."""
    return outputs

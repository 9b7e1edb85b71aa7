"""Masked-LM pre-training in Flax: the MLM head on the masked positions (decoder tied to the word embeddings) and
their cross-entropy."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

import jax
from tpuplex.layers.jax import ACTIVATIONS
from tpuplex.models import Architecture
from tpuplex.tasks import jax as tasks_jax
from tpuplex.tasks.masked_lm.heads import MaskedLMHead


class Head(nn.Module):
    """The hidden states [B, L, H] at `masked_positions` [B, P] (every position without them) -> dense H->E ->
    activation -> LayerNorm -> word embeddings^T + bias -> logits float32 [B, P, V]."""

    embedding_size: int
    vocab_size: int
    activation: str
    layer_norm_eps: float
    dtype: Any

    @nn.compact
    def __call__(self, hidden: jax.Array, word_embeddings: jax.Array, deterministic: bool,
                 masked_positions: jax.Array | None = None) -> jax.Array:
        if masked_positions is not None:
            hidden = jnp.take_along_axis(hidden, masked_positions[..., None], axis=1)
        x = ACTIVATIONS[self.activation](nn.Dense(self.embedding_size, dtype=self.dtype, name="transform")(hidden))
        x = nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=self.dtype, name="norm")(x)
        bias = self.param("bias", nn.initializers.zeros, (self.vocab_size,), jnp.float32)
        logits = jnp.einsum("ble,ve->blv", x, word_embeddings.astype(self.dtype)) + bias.astype(self.dtype)
        return logits.astype(jnp.float32)


class Module(tasks_jax.TaskModule):
    def build_head(self, arch: Architecture, head: MaskedLMHead, dtype: Any) -> Head:
        return Head(head.embedding_size, head.vocab_size, head.activation, head.layer_norm_eps, dtype)

    def unit_losses(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Per-position cross-entropy [B, P] of logits [B, P, V] against the original ids."""
        return tasks_jax.token_losses(outputs, rows["labels"])

    def predict_outputs(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """float32 [B, P, 2]: each position's cross-entropy and 1.0 where the most likely token is the label."""
        return tasks_jax.token_outputs(outputs, rows["labels"])

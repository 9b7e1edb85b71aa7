"""TextCNN as a Flax linen module (see textcnn/__init__.py)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from native_textcnn import DROPOUT, EMBEDDING_SIZE, FILTERS, WIDTHS


class TextCNN(nn.Module):
    vocab_size: int
    num_labels: int

    @nn.compact
    def __call__(self, input_ids, token_type_ids, attention_mask, deterministic: bool = True):
        tokens = nn.Embed(self.vocab_size, EMBEDDING_SIZE)(input_ids)  # [B, L, E]
        real = attention_mask[:, :, None] > 0
        # ReLU outputs are >= 0, so zeroing padded positions leaves the maximum over real ones unchanged.
        pooled = [jnp.where(real, nn.relu(nn.Conv(FILTERS, (width,), padding="SAME")(tokens)), 0.0).max(axis=1)
                  for width in WIDTHS]
        features = nn.Dropout(DROPOUT)(jnp.concatenate(pooled, axis=-1), deterministic=deterministic)
        return nn.Dense(self.num_labels)(features)

"""FlowersCNN as a Flax linen Module (see flowers_cnn/__init__.py). Batch norm as torch's BatchNorm2d computes it
(momentum 0.1 there is 0.9 here, epsilon 1e-5), so the three frameworks train the same network."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

import jax
from flowers_cnn import CHANNELS, DROPOUT


class FlowersCNN(nn.Module):
    num_labels: int
    image_shape: tuple[int, int, int]

    @nn.compact
    def __call__(self, images: jax.Array, train: bool, deterministic: bool) -> jax.Array:
        x = images  # [B, H, W, C]
        for index, width in enumerate(CHANNELS):
            x = nn.Conv(width, (3, 3), padding=1, use_bias=False, name=f"conv_{index}")(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5, use_fast_variance=False,
                             name=f"norm_{index}")(x)
            x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
        pooled = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_labels, name="classifier")(nn.Dropout(DROPOUT)(pooled, deterministic=deterministic))

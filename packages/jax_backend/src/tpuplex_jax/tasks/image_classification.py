"""Image classification in JAX: how the model (an image family, or your own Flax module) is called and what the
loss of each image is."""

from __future__ import annotations

import jax.numpy as jnp
import optax

import jax
from tpuplex.tasks.image_classification.data import crop_and_flip
from tpuplex_jax import tasks as tasks_jax
from tpuplex_jax.ops import JaxOps


class Module(tasks_jax.TaskModule):
    def model_inputs(self, rows: dict[str, jax.Array], train: bool, dropout: bool) -> tuple[tuple, dict]:
        """images uint8 [b, H, W, 3] (or the held training images' rows, cropped and flipped here) scaled to
        float32 [0, 1] on the device; `train` (batch statistics rather than the moving averages) and
        `deterministic` (dropout off: outside training, or when model.dropout is false)."""
        images = rows["images"] if "images" in rows else crop_and_flip(
            JaxOps(None, True), rows["train_images"], rows["image_index"], rows["shift"], rows["flip"])
        return (images.astype(jnp.float32) / 255.0,), {"train": train, "deterministic": not (train and dropout)}

    def unit_losses(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Cross-entropy per image [b] from logits [b, classes] (float32)."""
        return optax.softmax_cross_entropy_with_integer_labels(outputs.astype(jnp.float32), rows["labels"])

    def predict_outputs(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """Logits float32 [b, classes]."""
        return outputs.astype(jnp.float32)

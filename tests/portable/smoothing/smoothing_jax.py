"""Label-smoothed cross-entropy in JAX; the head and predictions are the built-in classifier's."""

import optax
from smoothing import SMOOTHING

import jax
from tpuplex.tasks.sequence_classification.jax import head_module, predict_outputs

__all__ = ["head_module", "predict_outputs", "unit_losses"]


def unit_losses(outputs: jax.Array, batch: dict[str, jax.Array]) -> jax.Array:
    """[B]: cross-entropy of logits [B, C] against smoothed one-hot labels."""
    targets = optax.smooth_labels(jax.nn.one_hot(batch["labels"], outputs.shape[-1]), SMOOTHING)
    return optax.softmax_cross_entropy(outputs, targets)

"""Label-smoothed cross-entropy in JAX; the head and predictions are the built-in classifier's."""

import optax
from smoothing import SMOOTHING

import jax
from tpuplex_jax.tasks import sequence_classification as classification


class Module(classification.Module):
    def unit_losses(self, outputs: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
        """[B]: cross-entropy of logits [B, C] against smoothed one-hot labels."""
        targets = optax.smooth_labels(jax.nn.one_hot(rows["labels"], outputs.shape[-1]), SMOOTHING)
        return optax.softmax_cross_entropy(outputs, targets)

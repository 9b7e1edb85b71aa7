"""Label-smoothed cross-entropy in TensorFlow; the head, predictions and serving outputs are the built-in
classifier's."""

import tensorflow as tf
from smoothing import SMOOTHING

from tpuplex_tf.tasks import sequence_classification as classification


class Module(classification.Module):
    def unit_losses(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """[B]: cross-entropy of logits [B, C] against smoothed one-hot labels."""
        classes = outputs.shape[-1]
        targets = tf.one_hot(tf.cast(batch["labels"], tf.int32), classes) * (1 - SMOOTHING) + SMOOTHING / classes
        return tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=outputs)

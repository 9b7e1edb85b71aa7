"""Image classification in Keras (TensorFlow): the model is your own Keras model; this module says what it is
called with, the loss of each image, and the SavedModel's serving outputs."""

from __future__ import annotations

import tensorflow as tf


def model_inputs(batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor]:
    """images uint8 [B, H, W, 3] -> float32 [B, H, W, 3] in [0, 1], scaled on the device."""
    return (tf.cast(batch["images"], tf.float32) / 255.0,)


def unit_losses(outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
    """Cross-entropy per image [B] from logits [B, classes]."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(batch["labels"], tf.int32),
                                                          logits=tf.cast(outputs, tf.float32))


def predict_outputs(outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
    """Logits float32 [B, classes]."""
    return tf.cast(outputs, tf.float32)

"""Speech recognition in TensorFlow: the model's call, each utterance's CTC loss and the predict outputs."""

from __future__ import annotations

import tensorflow as tf

from tpuplex.tasks import tf as tasks_tf
from tpuplex.tasks.speech_recognition.data import BLANK


class Module(tasks_tf.TaskModule):
    def model_inputs(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        return batch["features"], batch["attention_mask"]

    def unit_losses(self, outputs: tuple, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """float32 [b]: each utterance's CTC loss over its transcript's length; 0 where the model's frames cannot
        hold the transcript (see the torch module)."""
        logits, frames = outputs
        fits = feasible(frames, batch["labels"])
        labels = tf.where(fits[:, None], tf.cast(batch["labels"], tf.int32), BLANK)
        label_lengths = tf.reduce_sum(tf.cast(labels != BLANK, tf.int32), axis=1)
        losses = tf.nn.ctc_loss(labels, tf.cast(logits, tf.float32), label_lengths, frames, logits_time_major=False,
                                blank_index=BLANK)
        return tf.where(fits, losses / tf.cast(tf.maximum(label_lengths, 1), tf.float32), 0.0)

    def predict_outputs(self, outputs: tuple, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """float32 [b, T, 2]: each output frame's most likely symbol (-1 after the utterance's output frames, and
        on to the T input frames) and the utterance's loss."""
        logits, frames = outputs
        length = tf.shape(batch["features"])[1]
        ids = tf.argmax(logits, axis=-1, output_type=tf.int32)
        ids = tf.where(tf.range(tf.shape(ids)[1])[None, :] < frames[:, None], ids, -1)
        ids = tf.pad(ids, [[0, 0], [0, length - tf.shape(ids)[1]]], constant_values=-1)
        losses = self.unit_losses(outputs, batch)[:, None] * tf.ones([1, length])
        return tf.stack([tf.cast(ids, tf.float32), losses], axis=-1)


def feasible(frames: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """bool [b]: whether T' frames can align the transcript: one frame a symbol, and a blank between repeats."""
    labels = tf.cast(labels, tf.int32)
    repeats = tf.reduce_sum(tf.cast((labels[:, 1:] == labels[:, :-1]) & (labels[:, 1:] != BLANK), tf.int32), axis=1)
    return frames >= tf.reduce_sum(tf.cast(labels != BLANK, tf.int32), axis=1) + repeats

"""Speech recognition in TensorFlow: the model's call, each utterance's CTC loss, the predict outputs, and the
SavedModel that takes wav files' bytes and returns transcripts."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tpuplex.data.audio import EPSILON, LogMel, mel_matrix
from tpuplex.tasks.speech_recognition.data import BLANK
from tpuplex_tf import tasks as tasks_tf


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


    def serving(self, model, data) -> tasks_tf.Serving:
        """`serving_default` of a speech run's SavedModel: `audio`, a string [batch] of 16-bit PCM wav files (their
        bytes) -> `transcripts` string [batch]. The log-mel features are computed in the graph with TensorFlow's
        ops (`log_mel`, the recipe of `tpuplex.data.audio.LogMel`); a file at another sample rate than the run's,
        or not mono, fails in the graph with that message (the graph does not resample). Each file runs alone,
        as one utterance (an utterance's outputs do not depend on what it is batched with)."""
        settings, characters = data.options.features, tf.constant(["", *data.vocabulary.characters])

        def transcribe(wav: tf.Tensor) -> tf.Tensor:
            samples, rate = tf.audio.decode_wav(wav)
            tf.debugging.assert_equal(rate, settings.sample_rate,
                                      message=f"the wav's sample rate is not the run's {settings.sample_rate} Hz")
            tf.debugging.assert_equal(tf.shape(samples)[1], 1, message="the wav is not mono")
            features = log_mel(samples[:, 0], settings)[None]
            logits, frames = model(*self.model_inputs({"features": features,
                                                       "attention_mask": tf.ones(tf.shape(features)[:2], tf.int32)}))
            ids = tf.argmax(logits[0, : frames[0]], axis=-1, output_type=tf.int32)
            kept = (ids != BLANK) & tf.concat([[True], ids[1:] != ids[:-1]], axis=0)
            return tf.strings.reduce_join(tf.gather(characters, tf.boolean_mask(ids, kept)))

        def serve(audio: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"transcripts": tf.map_fn(transcribe, audio, fn_output_signature=tf.TensorSpec([], tf.string))}

        return tasks_tf.Serving({"serving_default": (serve, [tf.TensorSpec([None], tf.string, name="audio")])})


def log_mel(samples: tf.Tensor, settings: LogMel) -> tf.Tensor:
    """float32 [frames, mel_bins] of samples float32 [n]: `LogMel`'s features with `tf.signal`'s ops."""
    spectrum = tf.signal.stft(samples, settings.frame_length, settings.hop_length, settings.fft_length,
                              window_fn=tf.signal.hann_window, pad_end=False)
    power = tf.math.square(tf.math.real(spectrum)) + tf.math.square(tf.math.imag(spectrum))
    matrix = mel_matrix(settings.mel_bins, settings.fft_length // 2 + 1, settings.sample_rate).astype(np.float32)
    mel = tf.math.log(tf.matmul(power, matrix) + EPSILON)
    if settings.normalize != "utterance":
        return mel
    mean, variance = tf.nn.moments(mel, axes=[0], keepdims=True)
    return (mel - mean) / tf.sqrt(variance + EPSILON)


def feasible(frames: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """bool [b]: whether T' frames can align the transcript: one frame a symbol, and a blank between repeats."""
    labels = tf.cast(labels, tf.int32)
    repeats = tf.reduce_sum(tf.cast((labels[:, 1:] == labels[:, :-1]) & (labels[:, 1:] != BLANK), tf.int32), axis=1)
    return frames >= tf.reduce_sum(tf.cast(labels != BLANK, tf.int32), axis=1) + repeats

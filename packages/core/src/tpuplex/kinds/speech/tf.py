"""The speech families in Keras (TensorFlow): the parameters as variables under their names, and the operations
the forward pass (`tpuplex.models.conformer.forward`) is written over."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tpuplex.kinds.tf import Built, KindModule
from tpuplex.layers.tf import Variables, dropout
from tpuplex.models.conformer import SERVED_FRAMES, ConformerArch, forward, positions
from tpuplex.protocol import ModelSpec, OptimizerSpec


class TfOps:
    """`tpuplex.models.conformer.Ops` in TensorFlow; dropout stateless from `seed` (None: none), one mask per
    site. TensorFlow's CPU kernels take images channels-last, so convolutions transpose around the call."""

    def __init__(self, seed: tf.Tensor | None):
        self.seed = seed

    relu = staticmethod(tf.nn.relu)
    silu = staticmethod(tf.nn.silu)
    sigmoid = staticmethod(tf.sigmoid)
    where = staticmethod(tf.where)
    einsum = staticmethod(tf.einsum)
    reshape = staticmethod(tf.reshape)
    transpose = staticmethod(tf.transpose)

    def linear(self, x, weight, bias):
        # A matmul over the flattened rows: the gradient of einsum("...i,oi->...o") as TF takes it forms the
        # [..., o, i] outer product before summing it away, ~100x this step's other work.
        return tf.tensordot(x, weight, [[x.shape.rank - 1], [1]]) + bias

    def conv2d(self, x, weight, bias, stride):
        out = tf.nn.conv2d(tf.transpose(x, (0, 2, 3, 1)), tf.transpose(weight, (2, 3, 1, 0)), stride, "VALID")
        return tf.transpose(out + bias, (0, 3, 1, 2))

    def depthwise_conv1d(self, x, weight, bias):
        half = weight.shape[-1] // 2
        padded = tf.pad(x, [[0, 0], [half, half], [0, 0]])[:, :, None, :]  # [B, T + K - 1, 1, H]
        kernel = tf.transpose(weight, (2, 1, 0))[:, :, :, None]            # [K, 1, H, 1]
        return tf.nn.depthwise_conv2d(padded, kernel, [1, 1, 1, 1], "VALID")[:, :, 0, :] + bias

    def layer_norm(self, x, weight, bias, eps):
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        variance = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + eps) * weight + bias

    def softmax(self, x):
        return tf.nn.softmax(x, axis=-1)

    def shape(self, x):
        return tuple(size if size is not None else tf.shape(x)[axis] for axis, size in enumerate(x.shape))

    def constant(self, array: np.ndarray):
        return tf.constant(array)

    def positions(self, frames, width):
        """The table for `frames` rows: a constant where they are known when traced (training), else rows of one
        for SERVED_FRAMES (a SavedModel takes recordings of any length up to that)."""
        if isinstance(frames, int):
            return tf.constant(positions(frames, width))
        return tf.constant(positions(SERVED_FRAMES, width))[:frames]

    def dropout(self, x, rate, site):
        return dropout(x, rate, self.seed, site)

    def frame_mask(self, lengths, frames):
        return tf.cast(tf.range(frames)[None, :] < lengths[:, None], tf.float32)


class SpeechModel(keras.Model):
    """(features float32 [B, T, mel], attention_mask [B, T]) -> (logits [B, T', vocab], output_lengths [B])."""

    def __init__(self, arch: ConformerArch, shapes: dict[str, tuple[int, ...]], **kwargs):
        super().__init__(**kwargs)
        self.arch = arch
        self.named = {name: self.add_weight(shape=shape, initializer="zeros", name=name.replace(".", "_"))
                      for name, shape in shapes.items()}

    def call(self, features, attention_mask, seed: tf.Tensor | None = None):
        lengths = tf.reduce_sum(tf.cast(attention_mask, tf.int32), axis=1)
        logits = forward(TfOps(seed), {name: v.value for name, v in self.named.items()}, self.arch, features,
                         lengths)
        return logits, self.arch.output_frames(lengths)

    def hf_variables(self) -> Variables:
        return {name: (variable, False) for name, variable in self.named.items()}

    def state_variables(self) -> dict[str, keras.Variable]:
        return {}


class SpeechFamily(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        model = SpeechModel(arch, {name: tuple(np.shape(array)) for name, array in spec.params.items()})
        model(spec.example_batch["features"], spec.example_batch["attention_mask"])  # built, as Keras' export asks
        return Built(model, spec.params, {})

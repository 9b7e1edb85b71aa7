"""What every Keras (TensorFlow) module of tpuplex shares: activations by HF name, stateless dropout, the naming of
variables, and the table of operations the networks written once run on (`TfOps`, `tpuplex.models.ops`).

Dropout is stateless: every dropout site draws its mask from `tf.random.stateless_uniform` with a seed derived from
the `seed` argument, so a step is a pure function of (variables, batch, seed). That keeps XLA compilation, replicas
and exact resume simple (the tf backend's train step derives the seed from the optimizer step and the replica).

The tf backend's table (docs/ARCHITECTURE.md): its steps, and its kinds' and tasks' modules, build on it.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402  (the backend must be chosen before Keras is imported)
import tensorflow as tf  # noqa: E402

from tpuplex.errors import TpuplexError  # noqa: E402
from tpuplex.models.conformer import SERVED_FRAMES  # noqa: E402
from tpuplex.models.conformer import positions as sinusoidal_positions  # noqa: E402

if keras.backend.backend() != "tensorflow":
    raise TpuplexError(
        f"Keras runs on the {keras.backend.backend()!r} backend, but tpuplex-tf needs TensorFlow: "
        "set KERAS_BACKEND=tensorflow (or unset it) before starting"
    )

Variables = dict[str, tuple[keras.Variable, bool]]
"""Canonical (or HF) name -> (variable, whether it is a kernel in Keras' layout: Dense [in, out], Conv2D HWIO,
where torch has [out, in] and OIHW; see `tpuplex.checkpoints.to_torch_layout`)."""

ACTIVATIONS = {
    "gelu": lambda x: tf.nn.gelu(x, approximate=False),  # HF "gelu" is the exact erf form
    "gelu_new": lambda x: tf.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: tf.nn.gelu(x, approximate=True),
    "relu": tf.nn.relu,
    "tanh": tf.math.tanh,
    "silu": tf.nn.silu,
    "sigmoid": tf.sigmoid,
}


def dropout(x: tf.Tensor, rate: float, seed: tf.Tensor | None, site: int) -> tf.Tensor:
    """Inverted dropout with a stateless mask; identity when `seed` is None or the rate is 0.

    seed: int32 [2]; `site` makes each dropout location draw an independent mask.
    """
    if seed is None or rate == 0.0:
        return x
    site_seed = tf.random.experimental.stateless_fold_in(seed, site)
    keep = tf.random.stateless_uniform(tf.shape(x), seed=site_seed, dtype=x.dtype) >= rate
    # The scale goes on the mask, so x is read once forward and once backward; the same bits as
    # tf.where(keep, x / (1 - rate), 0), which Grappler turns into a multiply by the float32 reciprocal anyway.
    return x * (tf.cast(keep, x.dtype) * (1.0 / (1.0 - rate)))


class TfOps:
    """`tpuplex.models.ops.Ops` in TensorFlow: dropout stateless from `seed` (None: none), one mask per site;
    activations in `dtype` (bfloat16 under train.bf16), each float32 variable cast to it where it meets one.
    TensorFlow's CPU kernels take images channels-last, so convolutions transpose around the call."""

    def __init__(self, seed: tf.Tensor | None, dtype: tf.DType = tf.float32):
        self.seed, self.dtype = seed, dtype

    where = staticmethod(tf.where)
    einsum = staticmethod(tf.einsum)
    reshape = staticmethod(tf.reshape)
    transpose = staticmethod(tf.transpose)
    cos = staticmethod(tf.cos)
    sin = staticmethod(tf.sin)
    tanh = staticmethod(tf.tanh)

    def linear(self, x, weight, bias, in_out=False):
        # A matmul over the flattened rows: the gradient of einsum("...i,oi->...o") as TF takes it forms the
        # [..., o, i] outer product before summing it away, ~100x this step's other work.
        weight = tf.cast(weight, x.dtype)
        if in_out:
            out = tf.tensordot(x, weight, [[x.shape.rank - 1], [0]])
        else:  # [out, in]: the matmul reads W transposed, with no transposed copy of it
            flat = tf.matmul(tf.reshape(x, [-1, x.shape[-1]]), weight, transpose_b=True)
            out = tf.reshape(flat, tf.concat([tf.shape(x)[:-1], tf.shape(weight)[:1]], axis=0))
        return out if bias is None else out + tf.cast(bias, x.dtype)

    def embed(self, table, ids):
        return tf.cast(tf.gather(tf.cast(table, tf.float32), ids), self.dtype)

    def attention(self, query, key, value, mask, causal, scale, softcap, dropout, site, bias=None):
        rows, length, heads, size = self.shape(query)
        kv = key.shape[2]
        # Grouped-query attention: query head h reads key/value head h // (heads / kv), as HF's repeat_kv.
        grouped = tf.reshape(query, [rows, length, kv, heads // kv, size])
        scores = tf.cast(tf.einsum("btkgd,bskd->bkgts", grouped, key), tf.float32) * scale
        if softcap:
            scores = tf.tanh(scores / softcap) * softcap
        if bias is not None:
            scores = scores + tf.reshape(tf.cast(bias, tf.float32), [1, kv, heads // kv, *self.shape(bias)[2:]])
        scores = tf.where(mask[:, None, None], scores, scores.dtype.min)
        probs = tf.cast(self.dropout(tf.nn.softmax(scores, axis=-1), dropout, site), value.dtype)
        return tf.reshape(tf.einsum("bkgts,bskd->btkgd", probs, value), [rows, length, heads, size])

    def layer_norm(self, x, weight, bias, eps):
        # As Keras' layer_normalization: x * inv + (bias - mean * inv), inv = rsqrt(var + eps) * weight.
        x32 = tf.cast(x, tf.float32)
        mean, variance = tf.nn.moments(x32, axes=[-1], keepdims=True)
        inv = tf.math.rsqrt(variance + eps) * tf.cast(weight, tf.float32)
        shift = -mean * inv if bias is None else tf.cast(bias, tf.float32) - mean * inv
        return tf.cast(x32 * inv + shift, x.dtype)

    def rms_norm(self, x, weight, eps, offset=0.0):
        x32 = tf.cast(x, tf.float32)
        scale = tf.cast(weight, tf.float32) + offset
        out = x32 * tf.math.rsqrt(tf.reduce_mean(tf.square(x32), axis=-1, keepdims=True) + eps) * scale
        return tf.cast(out, x.dtype)

    def activation(self, name, x):
        return ACTIVATIONS[name](x)

    def softmax(self, x):
        return tf.nn.softmax(x, axis=-1)

    def concat(self, tensors, axis):
        return tf.concat(tensors, axis=axis)

    def split(self, x, sizes):
        return tf.split(x, sizes, axis=-1)

    def shape(self, x):
        return tuple(size if size is not None else tf.shape(x)[axis] for axis, size in enumerate(x.shape))

    def constant(self, array):
        return tf.constant(array)

    def arange(self, count):
        return tf.range(count)

    def float32(self, x):
        return tf.cast(x, tf.float32)

    def cast_like(self, x, like):
        return tf.cast(x, like.dtype)

    def dropout(self, x, rate, site):
        return dropout(x, rate, self.seed, site)

    def cache_write(self, cache, new, index):
        # A blend with one-hot rows: a dynamic update XLA compiles at a static shape.
        written = tf.one_hot(index + tf.range(tf.shape(new)[1]), tf.shape(cache)[1], dtype=cache.dtype)  # [T, S]
        keep = (1.0 - tf.reduce_sum(written, axis=0))[None, :, None, None]
        return cache * keep + tf.einsum("ts,btkd->bskd", written, tf.cast(new, cache.dtype))

    def conv2d(self, x, weight, bias, stride):
        out = tf.nn.conv2d(tf.transpose(x, (0, 2, 3, 1)), tf.transpose(weight, (2, 3, 1, 0)), stride, "VALID")
        return tf.transpose(out + bias, (0, 3, 1, 2))

    def depthwise_conv1d(self, x, weight, bias):
        half = weight.shape[-1] // 2
        padded = tf.pad(x, [[0, 0], [half, half], [0, 0]])[:, :, None, :]  # [B, T + K - 1, 1, H]
        kernel = tf.transpose(weight, (2, 1, 0))[:, :, :, None]            # [K, 1, H, 1]
        return tf.nn.depthwise_conv2d(padded, kernel, [1, 1, 1, 1], "VALID")[:, :, 0, :] + bias

    def positions(self, frames, width):
        """The table for `frames` rows: a constant where they are known when traced (training), else rows of one
        for SERVED_FRAMES (a SavedModel takes recordings of any length up to that)."""
        if isinstance(frames, int):
            return tf.constant(sinusoidal_positions(frames, width))
        return tf.constant(sinusoidal_positions(SERVED_FRAMES, width))[:frames]

    def frame_mask(self, lengths, frames):
        return tf.cast(tf.range(frames)[None, :] < lengths[:, None], tf.float32)

    def padded_attention(self, query, key, value, key_mask, scale, dropout, site):
        # Batched matmuls over [B, heads, T, D] and the padding as an additive bias: TensorFlow's CPU kernels run
        # them 25% faster than `attention`'s grouped einsums and mask (MiniLM's attention, forward and backward).
        query, key, value = (tf.transpose(t, (0, 2, 1, 3)) for t in (query, key, value))
        scores = tf.cast(tf.matmul(query, key, transpose_b=True), tf.float32) * scale
        padding = (1.0 - tf.cast(key_mask, tf.float32))[:, None, None, :] * tf.float32.min
        probs = tf.cast(self.dropout(tf.nn.softmax(scores + padding, axis=-1), dropout, site), value.dtype)
        return tf.transpose(tf.matmul(probs, value), (0, 2, 1, 3))

    def take(self, x, positions):
        return tf.gather(x, positions, batch_dims=1)

    def broadcast_to(self, x, shape):
        return tf.broadcast_to(x, shape)

    def conv2d_nhwc(self, x, weight, stride, padding):
        kernel = tf.transpose(tf.cast(weight, x.dtype), (2, 3, 1, 0))  # OIHW -> HWIO
        # "SAME" pads as torch does (kernel // 2 on each side) only for an odd kernel at stride 1, without a padded
        # copy of x; elsewhere (a strided or even kernel) it would pad one side less, so x is padded first.
        if padding and (stride != 1 or weight.shape[-1] % 2 == 0):
            x = tf.pad(x, [[0, 0], [padding, padding], [padding, padding], [0, 0]])
            return tf.nn.conv2d(x, kernel, stride, "VALID")
        return tf.nn.conv2d(x, kernel, stride, "SAME" if padding else "VALID")

    def max_pool(self, x, window, stride, padding):
        padded = tf.pad(x, [[0, 0], [padding, padding], [padding, padding], [0, 0]], constant_values=-math.inf)
        return tf.nn.max_pool2d(padded, window, stride, "VALID")

    def mean(self, x, axes):
        return tf.reduce_mean(x, axis=axes)

    def sum(self, x, axes):
        return tf.reduce_sum(x, axis=axes)

    def max(self, x, axes):
        return tf.reduce_max(x, axis=axes)

    def conv1d(self, x, weight, bias):
        width = weight.shape[-1]
        padded = tf.pad(x, [[0, 0], [(width - 1) // 2, width // 2], [0, 0]])
        out = tf.nn.conv1d(padded, tf.transpose(tf.cast(weight, x.dtype), (2, 1, 0)), 1, "VALID")  # OIW -> WIO
        return out if bias is None else out + tf.cast(bias, x.dtype)

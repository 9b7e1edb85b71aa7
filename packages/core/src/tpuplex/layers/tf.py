"""What every Keras (TensorFlow) module of tpuplex shares: activations by HF name, stateless dropout, and the
naming of variables.

Dropout is stateless: every dropout site draws its mask from `tf.random.stateless_uniform` with a seed derived from
the `seed` argument, so a step is a pure function of (variables, batch, seed). That keeps XLA compilation, replicas
and exact resume simple (the tf backend's train step derives the seed from the optimizer step and the replica).

A framework module (docs/ARCHITECTURE.md): imported by the tf backend and the `tf.py` of tasks and model kinds only.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402  (the backend must be chosen before Keras is imported)
import tensorflow as tf  # noqa: E402

from tpuplex.errors import TpuplexError  # noqa: E402

if keras.backend.backend() != "tensorflow":
    raise TpuplexError(
        f"Keras runs on the {keras.backend.backend()!r} backend, but tpuplex-tf needs TensorFlow: "
        "set KERAS_BACKEND=tensorflow (or unset it) before starting"
    )

Variables = dict[str, tuple[keras.Variable, bool]]
"""Canonical (or HF) name -> (variable, whether it is a kernel in Keras' layout: Dense [in, out], Conv2D HWIO,
where torch has [out, in] and OIHW; see `tpuplex.params.to_torch_layout`)."""

ACTIVATIONS = {
    "gelu": lambda x: tf.nn.gelu(x, approximate=False),  # HF "gelu" is the exact erf form
    "gelu_new": lambda x: tf.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: tf.nn.gelu(x, approximate=True),
    "relu": tf.nn.relu,
    "tanh": tf.math.tanh,
    "silu": tf.nn.silu,
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


def dense_variables(module: str, layer: keras.layers.Dense) -> Variables:
    return {f"{module}.weight": (layer.kernel, True), f"{module}.bias": (layer.bias, False)}


def norm_variables(module: str, layer: keras.layers.LayerNormalization) -> Variables:
    return {f"{module}.weight": (layer.gamma, False), f"{module}.bias": (layer.beta, False)}

"""The op table (`tpuplex.models.ops.Ops`, public as `tpuplex.nn.Ops`) against numpy on the three frameworks: each
op, at the shapes its docstring states, gives numpy's numbers on torch (`TorchOps`), jax (`JaxOps`) and tf
(`TfOps`) in float32, dropout off."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

import torch
from tpuplex_jax.ops import JaxOps
from tpuplex_tf.ops import TfOps
from tpuplex_torch.ops import TorchOps

TOLERANCE = 1e-5
rng = np.random.default_rng(0)


def normal(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


FRAMEWORKS = {
    "torch": (lambda: TorchOps(False, torch.device("cpu")), torch.from_numpy, lambda t: t.detach().numpy()),
    "jax": (lambda: JaxOps(None, True), jnp.asarray, np.asarray),
    "tf": (lambda: TfOps(None), tf.constant, lambda t: t.numpy()),
}


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def conv1d_same(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [B, T, C_in], w [C_out, C_in, K], torch's "same" padding ((K - 1) // 2 before, K // 2 after)."""
    width = w.shape[-1]
    padded = np.pad(x, ((0, 0), ((width - 1) // 2, width // 2), (0, 0)))
    return np.stack([np.einsum("bkc,ock->bo", padded[:, t:t + width], w) for t in range(x.shape[1])], axis=1)


def windows(x: np.ndarray, size: int, stride: int, padding: int, fill: float) -> np.ndarray:
    """x [B, H, W, C] padded with `fill` -> its size x size windows [B, H', W', C, size, size] at `stride`."""
    padded = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)), constant_values=fill)
    view = np.lib.stride_tricks.sliding_window_view(padded, (size, size), axis=(1, 2))
    return view[:, ::stride, ::stride]


def attention(q, k, v, mask, scale):
    """q [B, T, H, D] over k, v [B, S, KV, D] (query head h reads key head h // (H / KV))."""
    groups = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    scores = np.einsum("bthd,bshd->bhts", q, k) * scale
    scores = np.where(mask[:, None], scores, -1e30)
    return np.einsum("bhts,bshd->bthd", softmax(scores), v)


X, W, B = normal(2, 5, 8), normal(6, 8), normal(6)
IDS = rng.integers(0, 10, (2, 5)).astype(np.int32)
TABLE = normal(10, 8)
Q, K, V = normal(2, 5, 4, 8), normal(2, 5, 2, 8), normal(2, 5, 2, 8)
CAUSAL = np.tril(np.ones((5, 5), bool))[None]
KEY_MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
SEQUENCE, KERNEL, DEPTHWISE = normal(2, 7, 4), normal(3, 4, 4), normal(4, 1, 3)
IMAGES, FILTERS = normal(2, 6, 6, 3), normal(4, 3, 3, 3)
ROWS = normal(2, 5, 3)
POSITIONS = np.array([[0, 4], [2, 2]], np.int32)

# name -> (call on the ops and the framework's tensors, numpy's answer)
CASES = {
    "linear": (lambda o, t: o.linear(t(X), t(W), t(B)), X @ W.T + B),
    "linear_in_out": (lambda o, t: o.linear(t(X), t(W.T.copy()), None, in_out=True), X @ W.T),
    "embed": (lambda o, t: o.embed(t(TABLE), t(IDS)), TABLE[IDS]),
    "layer_norm": (lambda o, t: o.layer_norm(t(X), t(W[0]), t(B[:1].repeat(8)), 1e-5),
                   (X - X.mean(-1, keepdims=True)) / np.sqrt(X.var(-1, keepdims=True) + 1e-5) * W[0] + B[0]),
    "rms_norm": (lambda o, t: o.rms_norm(t(X), t(W[0]), 1e-6, offset=1.0),
                 X / np.sqrt((X**2).mean(-1, keepdims=True) + 1e-6) * (1.0 + W[0])),
    "gelu": (lambda o, t: o.activation("gelu", t(X)), 0.5 * X * (1 + np.vectorize(math.erf)(X / math.sqrt(2)))),
    "relu": (lambda o, t: o.activation("relu", t(X)), np.maximum(X, 0)),
    "silu": (lambda o, t: o.activation("silu", t(X)), X / (1 + np.exp(-X))),
    "softmax": (lambda o, t: o.softmax(t(X)), softmax(X)),
    "where": (lambda o, t: o.where(t(X > 0), t(X), t(-X)), np.abs(X)),
    "reshape": (lambda o, t: o.reshape(t(X), (2, 40)), X.reshape(2, 40)),
    "transpose": (lambda o, t: o.transpose(t(X), (2, 0, 1)), X.transpose(2, 0, 1)),
    "concat": (lambda o, t: o.concat([t(X), t(X * 2)], -1), np.concatenate([X, X * 2], -1)),
    "split": (lambda o, t: o.split(t(X), [3, 5])[1], X[..., 3:]),
    "einsum": (lambda o, t: o.einsum("btf,of->bto", t(X), t(W)), np.einsum("btf,of->bto", X, W)),
    "sum": (lambda o, t: o.sum(t(X), (1,)), X.sum(1)),
    "max": (lambda o, t: o.max(t(X), (1, 2)), X.max((1, 2))),
    "mean": (lambda o, t: o.mean(t(X), (1,)), X.mean(1)),
    "conv1d": (lambda o, t: o.conv1d(t(SEQUENCE), t(KERNEL[:, :, :3]), t(B[:3])),
               conv1d_same(SEQUENCE, KERNEL[:, :, :3]) + B[:3]),
    "conv1d_even": (lambda o, t: o.conv1d(t(SEQUENCE), t(KERNEL), None), conv1d_same(SEQUENCE, KERNEL)),
    "depthwise_conv1d": (lambda o, t: o.depthwise_conv1d(t(SEQUENCE), t(DEPTHWISE), t(B[:4])),
                         conv1d_same(SEQUENCE, np.eye(4, dtype=np.float32)[:, :, None] * DEPTHWISE) + B[:4]),
    "attention_causal": (lambda o, t: o.attention(t(Q), t(K), t(V), t(CAUSAL), True, 0.3, 0.0, 0.0, 0),
                         attention(Q, K, V, CAUSAL, 0.3)),
    "padded_attention": (lambda o, t: o.padded_attention(t(Q), t(K.repeat(2, 2)), t(V.repeat(2, 2)), t(KEY_MASK),
                                                         0.3, 0.0, 0),
                         attention(Q, K.repeat(2, 2), V.repeat(2, 2), (KEY_MASK > 0)[:, None, :], 0.3)),
    "take": (lambda o, t: o.take(t(ROWS), t(POSITIONS)), np.take_along_axis(ROWS, POSITIONS[:, :, None], 1)),
    "broadcast_to": (lambda o, t: o.broadcast_to(t(B), (3, 6)), np.broadcast_to(B, (3, 6))),
    "mean_pool_image": (lambda o, t: o.mean(t(IMAGES), (1, 2)), IMAGES.mean((1, 2))),
    "max_pool": (lambda o, t: o.max_pool(t(IMAGES), 3, 2, 1), windows(IMAGES, 3, 2, 1, -np.inf).max((4, 5))),
    "conv2d_nhwc": (lambda o, t: o.conv2d_nhwc(t(IMAGES), t(FILTERS), 2, 1),
                    np.einsum("bhwcij,ocij->bhwo", windows(IMAGES, 3, 2, 1, 0.0), FILTERS)),
    "frame_mask": (lambda o, t: o.frame_mask(t(np.array([2, 4], np.int32)), 5),
                   (np.arange(5)[None] < np.array([2, 4])[:, None]).astype(np.float32)),
}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("case", CASES)
def test_each_op_gives_numpys_numbers(framework, case):
    make_ops, tensor, to_numpy = FRAMEWORKS[framework]
    call, expected = CASES[case]
    found = to_numpy(call(make_ops(), tensor))
    assert found.shape == expected.shape
    np.testing.assert_allclose(found, expected, atol=TOLERANCE, rtol=TOLERANCE)

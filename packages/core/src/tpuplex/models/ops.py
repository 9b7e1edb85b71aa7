"""The operations a network written once asks of a framework (`Ops`), so one forward pass runs on all three.

The networks (`tpuplex.models.decoder.forward`, `tpuplex.models.encoder.forward`, `tpuplex.models.t5`,
`tpuplex.models.vit.forward`, `tpuplex.models.resnet.forward`, `tpuplex.models.conformer.forward`) are plain Python
over this table; each framework gives it once (`tpuplex_{jax,tf,torch}.ops`: `JaxOps`, `TfOps`, `TorchOps`), the way
Keras 3 writes its layers over `keras.ops`. The table holds only what truly differs between frameworks: the fused
kernels each one has (attention, norms), how dropout draws its masks, how an embedding is gathered, how a cache is
written in place or as a new array. Arithmetic, slicing (`x[..., :h]`), comparisons and `&` on boolean tensors
are the tensors' own operators in all three.

Shapes: activations are [B, T, H] (batch, positions, features); attention takes query [B, T, heads, D] and keys
and values [B, S, kv_heads, D], `kv_heads` dividing `heads` (grouped-query attention: query head h reads key head
h // (heads / kv_heads)). Weights keep their portable layout (torch's: a Linear [out, in], a Conv2d OIHW), so the
framework module holds the checkpoint's arrays as they are.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Ops(Protocol):
    """What a forward pass asks of a framework; arrays are its tensors.

    dropout(x, rate, site) draws its mask from the framework's own generator, a different one at each `site` (the
    stateless TensorFlow table derives the mask from the site; the others count calls). `compute_dtype` is the
    dtype activations are computed in (float32, or bfloat16 under `train.bf16`); parameters stay float32 and are
    cast where they meet an activation.
    """

    def linear(self, x: Any, weight: Any, bias: Any | None, in_out: bool = False) -> Any:
        """x [..., in] -> [..., out]: x @ W.T + b with W [out, in], or x @ W + b with W [in, out] (`in_out`: GPT-2's
        Conv1D layout)."""
    def embed(self, table: Any, ids: Any) -> Any:
        """table [V, H] (float32), ids int [...] -> rows [..., H] in the compute dtype, gathered from the float32
        table (its gradient, a scatter-add into the table, stays float32)."""
    def attention(self, query: Any, key: Any, value: Any, mask: Any, causal: bool, scale: float, softcap: float,
                  dropout: float, site: int, bias: Any = None) -> Any:
        """[B, T, heads, D] of query [B, T, heads, D] over key, value [B, S, kv_heads, D]: softmax(scale q k^T
        [+ bias]) (the scores capped at softcap * tanh(s / softcap) when softcap > 0) with attention dropout
        `dropout`. mask: bool [B or 1, T or 1, S], True where a query sees a key; causal: the mask is plain causal
        attention over T = S positions, which a fused causal kernel may do without reading it; bias: None, or float
        [1, heads, T, S] added to the scores (T5's relative positions). A query that sees no key gets a uniform
        average, never a NaN."""
    def layer_norm(self, x: Any, weight: Any, bias: Any | None, eps: float) -> Any: ...
    def rms_norm(self, x: Any, weight: Any, eps: float, offset: float = 0.0) -> Any:
        """x / rms(x) * (offset + weight), the statistics in float32 (Gemma stores its scale less one: offset 1)."""
    def activation(self, name: str, x: Any) -> Any:
        """HF's activation `name` (`tpuplex.models.decoder.DECODER_ACTIVATIONS`, "tanh", "sigmoid")."""
    def softmax(self, x: Any) -> Any: ...                                        # over the last axis
    def where(self, condition: Any, x: Any, y: Any) -> Any: ...
    def reshape(self, x: Any, shape: tuple[Any, ...]) -> Any: ...
    def transpose(self, x: Any, axes: tuple[int, ...]) -> Any: ...
    def concat(self, tensors: list[Any], axis: int) -> Any: ...
    def split(self, x: Any, sizes: list[int]) -> list[Any]:
        """x [..., sum(sizes)] in consecutive parts along the last axis (one op, whose gradient is one concatenation:
        three slices' gradients would be three zero-padded full-size arrays added up)."""
    def einsum(self, equation: str, *operands: Any) -> Any: ...
    def shape(self, x: Any) -> tuple[Any, ...]: ...                             # static where known
    def constant(self, array: np.ndarray) -> Any: ...
    def arange(self, count: Any) -> Any: ...                                    # int32 [count]
    def float32(self, x: Any) -> Any: ...
    def cast_like(self, x: Any, like: Any) -> Any: ...                          # x in like's dtype
    def cos(self, x: Any) -> Any: ...
    def sin(self, x: Any) -> Any: ...
    def tanh(self, x: Any) -> Any: ...
    def dropout(self, x: Any, rate: float, site: int) -> Any: ...
    def cache_write(self, cache: Any, new: Any, index: Any) -> Any:
        """cache [B, S, kv, D] with new [B, T, kv, D] written at positions index..index + T - 1 (index an int or a
        traced scalar): the updated cache (in place where the framework allows)."""
    # The Conformer's convolutions and frame bookkeeping.
    def conv2d(self, x: Any, weight: Any, bias: Any, stride: int) -> Any: ...    # NCHW, OIHW, no padding
    def depthwise_conv1d(self, x: Any, weight: Any, bias: Any) -> Any: ...       # x [B, T, H], W [H, 1, K], "same"
    def positions(self, frames: Any, width: int) -> Any: ...                     # sinusoidal [frames, width]
    def frame_mask(self, lengths: Any, frames: int) -> Any: ...                  # float [B, frames]: t < lengths
    # The text encoders' padded attention and the masked LM's positions.
    def padded_attention(self, query: Any, key: Any, value: Any, key_mask: Any, scale: float, dropout: float,
                         site: int) -> Any:
        """`attention` of query [B, T, heads, D] over key, value [B, S, heads, D], each row seeing the keys
        key_mask int [B, S] keeps: 1 on its first keys, 0 on its right padding (tpuplex's batches), which lets a
        fused kernel read each row's key count alone (cuDNN's on a GPU)."""
    def take(self, x: Any, positions: Any) -> Any:
        """x [B, T, ...] at positions int [B, P] -> [B, P, ...] (each row its own positions)."""
    # The image models (images channels-last: [B, H, W, C], the host batches' layout).
    def broadcast_to(self, x: Any, shape: tuple[Any, ...]) -> Any: ...          # x repeated to shape (numpy's rule)
    def conv2d_nhwc(self, x: Any, weight: Any, stride: int, padding: int) -> Any:
        """x [B, H, W, C_in] convolved with weight [C_out, C_in, k, k] (OIHW), no bias, `padding` zeros on every
        side (torch's rule) -> [B, H', W', C_out]."""
    def max_pool(self, x: Any, window: int, stride: int, padding: int) -> Any:
        """x [B, H, W, C] max-pooled over window x window, `padding` of -inf on every side (torch's MaxPool2d)."""
    def mean(self, x: Any, axes: tuple[int, ...]) -> Any: ...                   # over axes, dropping them
    def sum(self, x: Any, axes: tuple[int, ...]) -> Any: ...                    # over axes, dropping them
    def max(self, x: Any, axes: tuple[int, ...]) -> Any: ...                    # over axes, dropping them
    # Sequences (a network of your own, `tpuplex.nn`).
    def conv1d(self, x: Any, weight: Any, bias: Any | None) -> Any:
        """x [B, T, C_in] convolved along T with weight [C_out, C_in, K] (torch's Conv1d layout) and bias [C_out]
        (or None), "same" padding as torch pads it ((K - 1) // 2 zeros before, K // 2 after) -> [B, T, C_out]."""

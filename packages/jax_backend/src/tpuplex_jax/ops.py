"""What every Flax (JAX) module of tpuplex shares: activations by HF name, the naming between Flax trees and
portable names, and the table of operations the networks written once run on (`JaxOps`, `tpuplex.models.ops`).

Modules are named after the core's *canonical* parameter names, so a parameter's tree path spells its canonical
name (`block.3/query/kernel` is `block.3.query.weight`, transposed: Flax keeps Dense kernels [in, out], torch
[out, in]); a family's table (`Family.hf_names`) turns those into HF names. A `Naming` holds that table;
`flax_views` turns portable arrays into a tree read a block at a time (the initial state and checkpoints, placed
on a mesh without ever being whole), `to_portable_arrays` / `to_portable_slices` turn a tree back, whole or as
each process's slices (parameters, and Adam moments, which share the layout). A model of
your own gets a native `Naming`: its tree paths as they are.

The jax backend's table (docs/ARCHITECTURE.md): its steps, and its kinds' and tasks' modules, build on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

import jax
from tpuplex.checkpoints import flax_axes, torch_axes, torch_shape
from tpuplex.models.conformer import positions as sinusoidal_positions
from tpuplex.slices import Slice, View

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # HF "gelu" is the exact erf form
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
}


CUDNN_HEAD_DIMS = range(8, 129, 8)
"""Head sizes cuDNN's fused attention takes (bf16/fp16 operands)."""


_CANONICAL_LEAF = {"kernel": "weight", "scale": "weight", "embedding": "weight", "bias": "bias"}


def canonical_name(path: tuple[Any, ...]) -> str:
    """The canonical name of the Flax parameter at tree `path` (jax.tree_util key path or plain strings)."""
    *modules, leaf = (getattr(key, "key", key) for key in path)
    return ".".join([*modules, _CANONICAL_LEAF.get(leaf, leaf)])


def _is_kernel(path: tuple[Any, ...]) -> bool:
    return getattr(path[-1], "key", path[-1]) == "kernel"


@dataclasses.dataclass(frozen=True)
class Naming:
    """How the paths of a Flax tree become portable names.

    names: canonical name -> portable name (HF names for a family, from `Family.hf_names`).
    torch_layout: kernels take torch's layout (Dense [out, in], Conv OIHW) for HF families; a user model's
        arrays keep their Flax layout.
    """

    names: Mapping[str, str]
    torch_layout: bool = True

    @classmethod
    def native(cls, tree: Any) -> Naming:
        """A user model's naming: the tree path joined with ".", leaves as Flax calls them, Flax layout."""
        flat = jax.tree_util.tree_flatten_with_path(tree)[0]
        return cls({canonical_name(path): ".".join(str(getattr(key, "key", key)) for key in path)
                    for path, _ in flat}, torch_layout=False)

    @classmethod
    def hf(cls, tree: Any, collection: bool = False) -> Naming:
        """A tree whose module names are already HF's (the image families): the canonical names as they are,
        without the Flax collection's name (`batch_stats`) when `collection`."""
        flat = jax.tree_util.tree_flatten_with_path(tree)[0]
        names = (canonical_name(path) for path, _ in flat)
        return cls({name: name.split(".", 1)[1] if collection else name for name in names})

    def of(self, path: tuple[Any, ...]) -> str:
        return self.names[canonical_name(path)]

    def transposed(self, path: tuple[Any, ...]) -> bool:
        return self.torch_layout and _is_kernel(path)

    def shapes(self, template: Any) -> dict[str, tuple[int, ...]]:
        """Portable name -> portable shape of every leaf of `template`."""
        flat = jax.tree_util.tree_flatten_with_path(template)[0]
        return {self.of(path): torch_shape(tuple(leaf.shape))
                if self.transposed(path) else tuple(leaf.shape) for path, leaf in flat}


def flax_views(arrays: Mapping[str, Any], template: Any, naming: Naming) -> Any:
    """Portable arrays (any `tpuplex.slices.SliceReader`) -> a tree shaped like `template` of `View`s in Flax's
    layout and the template's dtypes, each read a block at a time (`jax.make_array_from_callback`)."""
    def view(path, leaf) -> View:
        source = arrays[naming.of(path)]
        return View(source, flax_axes(len(source.shape)) if naming.transposed(path) else None, np.dtype(leaf.dtype))

    return jax.tree_util.tree_map_with_path(view, template)


def _portable(array: Any) -> np.ndarray:
    """A leaf's values as the portable state stores them: float32, counts int64 (0-d stays 0-d)."""
    array = np.asarray(array)
    return np.array(array, dtype=np.int64 if np.issubdtype(array.dtype, np.integer) else np.float32, order="C")


def to_portable_arrays(tree: Any, naming: Naming) -> dict[str, np.ndarray]:
    """A Flax tree (parameters, Adam moments, batch statistics) of whole host arrays -> portable numpy arrays."""
    def portable(path, leaf) -> np.ndarray:
        array = _portable(leaf)
        return np.ascontiguousarray(array.transpose(torch_axes(array.ndim))) if naming.transposed(path) else array

    return {naming.of(path): portable(path, leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def to_portable_slices(tree: Any, naming: Naming) -> dict[str, list[Slice]]:
    """A Flax tree of (sharded) jax arrays -> the portable slices this process writes: of each block, the copy
    with replica id 0, on whichever process's device holds it (so each block is written exactly once)."""
    def slices(path, leaf: jax.Array) -> list[Slice]:
        held = []
        for shard in leaf.addressable_shards:
            if shard.replica_id != 0:
                continue
            start = tuple(part.start or 0 for part in shard.index)
            piece = Slice(tuple(leaf.shape), start, _portable(shard.data))
            held.append(piece.transposed(torch_axes(leaf.ndim)) if naming.transposed(path) else piece)
        return held

    return {naming.of(path): slices(path, leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


class JaxOps:
    """`tpuplex.models.ops.Ops` in jax, inside a Flax module's call: dropout from the module's "dropout" generator
    unless `deterministic`; activations in `dtype` (bfloat16 under train.bf16), each float32 parameter cast to it
    where it meets one. Attention is XLA's (the scores written out, softmax in float32), or cuDNN's fused kernel
    on a GPU in bfloat16 without dropout or soft-capping."""

    def __init__(self, module: nn.Module, deterministic: bool, dtype: Any = jnp.float32):
        self.module, self.deterministic, self.dtype = module, deterministic, dtype

    where = staticmethod(jnp.where)
    einsum = staticmethod(jnp.einsum)
    reshape = staticmethod(jnp.reshape)
    transpose = staticmethod(jnp.transpose)
    cos = staticmethod(jnp.cos)
    sin = staticmethod(jnp.sin)
    tanh = staticmethod(jnp.tanh)

    def linear(self, x, weight, bias, in_out=False):
        weight = weight.astype(x.dtype)
        # Contracting W's own input axis: XLA reads [out, in] as it is, with no transposed copy.
        out = jax.lax.dot_general(x, weight, (((x.ndim - 1,), (0 if in_out else 1,)), ((), ())))
        return out if bias is None else out + bias.astype(x.dtype)

    def embed(self, table, ids):
        return jnp.take(table, ids, axis=0).astype(self.dtype)

    def attention(self, query, key, value, mask, causal, scale, softcap, dropout, site, bias=None):
        rate = 0.0 if self.deterministic else dropout
        heads, kv = query.shape[2], key.shape[2]
        if (causal and not rate and not softcap and bias is None and jax.default_backend() == "gpu"
                and query.dtype in (jnp.bfloat16, jnp.float16) and query.shape[-1] in CUDNN_HEAD_DIMS):
            return jax.nn.dot_product_attention(query, key, value, scale=scale, is_causal=True,
                                                implementation="cudnn")
        rows, length, _, size = query.shape
        # Grouped-query attention: query head h reads key/value head h // (heads / kv), as HF's repeat_kv.
        grouped = query.reshape(rows, length, kv, heads // kv, size)
        scores = jnp.einsum("btkgd,bskd->bkgts", grouped, key).astype(jnp.float32) * scale
        if softcap:
            scores = jnp.tanh(scores / softcap) * softcap
        if bias is not None:
            scores = scores + bias.astype(jnp.float32).reshape(bias.shape[0], kv, heads // kv, *bias.shape[2:])
        scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
        probs = self.dropout(jax.nn.softmax(scores, axis=-1), rate, site)
        return jnp.einsum("bkgts,bskd->btkgd", probs.astype(value.dtype), value).reshape(rows, length, heads, size)

    def layer_norm(self, x, weight, bias, eps):
        # Flax's own norms, given the weights: its fused one-pass statistics and backward (a hand-written LayerNorm
        # made XLA:CPU duplicate the backward's elementwise chain across layers: nanoGPT's step 12% slower).
        params = {"scale": weight, **({"bias": bias} if bias is not None else {})}
        return nn.LayerNorm(epsilon=eps, use_bias=bias is not None, dtype=x.dtype).apply({"params": params}, x)

    def rms_norm(self, x, weight, eps, offset=0.0):
        scale = weight + offset if offset else weight
        return nn.RMSNorm(epsilon=eps, dtype=x.dtype).apply({"params": {"scale": scale}}, x)

    def activation(self, name, x):
        return ACTIVATIONS[name](x)

    def softmax(self, x):
        return jax.nn.softmax(x, axis=-1)

    def concat(self, tensors, axis):
        return jnp.concatenate(tensors, axis=axis)

    def split(self, x, sizes):
        return jnp.split(x, np.cumsum(sizes)[:-1].tolist(), axis=-1)

    def shape(self, x):
        return x.shape

    def constant(self, array):
        return jnp.asarray(array)

    def arange(self, count):
        return jnp.arange(count)

    def float32(self, x):
        return x.astype(jnp.float32)

    def cast_like(self, x, like):
        return x.astype(like.dtype)

    def dropout(self, x, rate, site):
        return nn.Dropout(rate)(x, deterministic=self.deterministic) if rate else x

    def cache_write(self, cache, new, index):
        return jax.lax.dynamic_update_slice(cache, new.astype(cache.dtype), (0, index, 0, 0))

    def conv2d(self, x, weight, bias, stride):
        out = jax.lax.conv_general_dilated(x, weight, (stride, stride), "VALID",
                                           dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return out + bias[None, :, None, None]

    def depthwise_conv1d(self, x, weight, bias):
        half = weight.shape[-1] // 2
        out = jax.lax.conv_general_dilated(x, weight, (1,), [(half, half)], dimension_numbers=("NWC", "OIW", "NWC"),
                                           feature_group_count=weight.shape[0])
        return out + bias

    def positions(self, frames, width):
        return self.constant(sinusoidal_positions(frames, width))

    def frame_mask(self, lengths, frames):
        return (jnp.arange(frames)[None, :] < lengths[:, None]).astype(jnp.float32)

    def padded_attention(self, query, key, value, key_mask, scale, dropout, site):
        if ((self.deterministic or not dropout) and jax.default_backend() == "gpu"
                and query.dtype in (jnp.bfloat16, jnp.float16) and query.shape[-1] in CUDNN_HEAD_DIMS):
            # cuDNN's flash kernel from each row's key count (a filler row of none given one: no empty softmax).
            lengths = jnp.maximum(key_mask.sum(axis=-1).astype(jnp.int32), 1)
            return jax.nn.dot_product_attention(query, key, value, scale=scale, key_value_seq_lengths=lengths,
                                                implementation="cudnn")
        return self.attention(query, key, value, key_mask[:, None, :] > 0, False, scale, 0.0, dropout, site)

    def take(self, x, positions):
        return jnp.take_along_axis(x, positions.reshape(*positions.shape, *(1,) * (x.ndim - 2)), axis=1)

    def broadcast_to(self, x, shape):
        return jnp.broadcast_to(x, shape)

    def conv2d_nhwc(self, x, weight, stride, padding):
        return jax.lax.conv_general_dilated(x, weight.astype(x.dtype), (stride, stride), [(padding, padding)] * 2,
                                            dimension_numbers=("NHWC", "OIHW", "NHWC"))

    def max_pool(self, x, window, stride, padding):
        return nn.max_pool(x, (window, window), (stride, stride), ((padding, padding),) * 2)

    def mean(self, x, axes):
        return x.mean(axis=axes)

    def sum(self, x, axes):
        return x.sum(axis=axes)

    def max(self, x, axes):
        return x.max(axis=axes)

    def conv1d(self, x, weight, bias):
        width = weight.shape[-1]
        out = jax.lax.conv_general_dilated(x, weight.astype(x.dtype), (1,), [((width - 1) // 2, width // 2)],
                                           dimension_numbers=("NWC", "OIW", "NWC"))
        return out if bias is None else out + bias.astype(x.dtype)

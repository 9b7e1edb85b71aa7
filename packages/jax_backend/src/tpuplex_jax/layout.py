"""The training state laid out over the device mesh as `tpuplex.sharding` decides (Flax trees of NamedShardings),
and device arrays back to whole host arrays.

The core decides a `Layout` per parameter in its portable (torch) layout; a Flax kernel is the transpose of that
(Dense [in, out], convolutions HWIO), so its layout is permuted the same way (`tpuplex.checkpoints.from_torch_axes`).
Adam's moments take their parameter's layout (`optax.tree_map_params`); counts, the injected learning rate and the
model's other collections (batch-norm statistics) stay replicated.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

import jax
from tpuplex import sharding
from tpuplex.checkpoints import from_torch_axes
from tpuplex_jax.ops import Naming
from tpuplex_jax.step import TrainState


def state_sharding(mesh: jax.sharding.Mesh, optimizer: optax.GradientTransformation, state: TrainState,
                   naming: Naming, shapes: Mapping[str, tuple[int, ...]], axes: sharding.Mesh,
                   tensor_dims: Mapping[str, int]) -> TrainState:
    """The NamedSharding of every leaf of `state` (a TrainState of host arrays, views or shapes): parameters and
    moments by the core's layouts of their portable names and `shapes` (`tensor_dims`: the dimension each weight's
    tensor-parallel role splits), on the mesh whose axis sizes are `axes`."""
    replicated = NamedSharding(mesh, PartitionSpec())
    layouts = sharding.layouts(shapes, axes, tensor_dims)

    def of_parameter(path: tuple[Any, ...], _: Any) -> NamedSharding:
        portable = layouts[naming.of(path)]
        return NamedSharding(mesh, PartitionSpec(*(from_torch_axes(portable) if naming.transposed(path)
                                                   else portable)))

    params = jax.tree_util.tree_map_with_path(of_parameter, state.params)
    opt_state = optax.tree_map_params(optimizer, lambda _, shard: shard, state.opt_state, params,
                                      transform_non_params=lambda _: replicated)
    return TrainState(params, opt_state, jax.tree.map(lambda _: replicated, state.model_state),
                      jax.tree_util.tree_map_with_path(of_parameter, state.frozen))


def shapes_of(tree: Any) -> Any:
    """`tree` (of arrays or `tpuplex.slices.SliceReader`s) as `jax.ShapeDtypeStruct`s, for `jax.eval_shape`."""
    return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype), tree)


def place(state: Any, shardings: Any) -> Any:
    """Host arrays or `tpuplex.slices.SliceReader`s -> device arrays laid out by `shardings` (a tree of the same
    structure). Each device reads only the block its sharding names (`make_array_from_callback`), so no device,
    and no host reading a checkpoint, ever holds a whole split parameter."""
    def put(value: Any, shard: NamedSharding) -> jax.Array:
        if isinstance(value, jax.Array) or not hasattr(value, "shape"):
            value = np.asarray(value)
        return jax.make_array_from_callback(tuple(value.shape), shard, lambda index: np.asarray(value[index]))

    return jax.tree.map(put, state, shardings)


def bytes_per_device(trees: Any) -> int:
    """The most bytes any one device holds of the arrays in `trees` (their addressable shards)."""
    held: collections.Counter = collections.Counter()
    for leaf in jax.tree.leaves(trees):
        for shard in leaf.addressable_shards:
            held[shard.device] += shard.data.nbytes
    return max(held.values(), default=0)


def host_array(value: Any) -> np.ndarray:
    """A whole numpy copy of a device array however it is laid out: a replicated one read from a local shard, a
    split one assembled from its shards (on a multi-host job gathered from every process: collective, so every
    process calls it in the same order)."""
    if not isinstance(value, jax.Array):
        return np.asarray(value)
    if value.is_fully_replicated:
        return np.array(value.addressable_shards[0].data)
    if value.is_fully_addressable:
        return np.asarray(value)
    return np.asarray(multihost_utils.process_allgather(value, tiled=True))

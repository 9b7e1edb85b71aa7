"""The JAX training state to and from `tpuplex.protocol.PortableState` (HF names, torch layout).

Adam's mu and nu become `exp_avg` and `exp_avg_sq` and share the parameters' layout (Dense kernels transposed);
the AdamW bias-correction count is the portable `step`. A checkpoint is written from each process's own shards
(`to_slices`) and restored as views that each device reads its block from (`from_portable`), so a sharded state is
never whole on one host. Restoring sets Adam's count (and inject_hyperparams'
own) to that step, so the next update, and its dropout draw, are exactly the ones an uninterrupted run makes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import optax

import jax
from tpuplex.checkpoints import check_names
from tpuplex.protocol import PortableState
from tpuplex_jax.layout import host_array
from tpuplex_jax.ops import Naming, flax_views, to_portable_arrays, to_portable_slices
from tpuplex_jax.step import TrainState, adam_state, with_adam_state


def to_portable(state: TrainState, naming: Naming, state_naming: Naming) -> PortableState:
    """Numpy copies of the parameters, moments and non-trainable state under their portable names."""
    adam = adam_state(state.opt_state)
    return PortableState(params=to_portable_arrays(_host(state.network_params), naming),
                         exp_avg=to_portable_arrays(_host(adam.mu), naming),
                         exp_avg_sq=to_portable_arrays(_host(adam.nu), naming), step=int(_host(adam.count)),
                         buffers=to_portable_arrays(_host(state.model_state), state_naming))


def to_slices(state: TrainState, naming: Naming, state_naming: Naming) -> PortableState:
    """The slices of the parameters, moments and non-trainable state this process writes to a checkpoint."""
    adam = adam_state(state.opt_state)
    return PortableState(params=to_portable_slices(state.network_params, naming),
                         exp_avg=to_portable_slices(adam.mu, naming), exp_avg_sq=to_portable_slices(adam.nu, naming),
                         step=int(host_array(adam.count)), buffers=to_portable_slices(state.model_state, state_naming))


def from_portable(arrays: PortableState, template: TrainState, programs: Any) -> TrainState:
    """A host TrainState equal to `arrays`, structured like `template`, of views read a block at a time when
    placed (`tpuplex_jax.layout.place`); `programs` (the backend's) gives the expected names and shapes.

    Raises TpuplexError (via tpuplex.checkpoints.check_names) naming missing, unexpected or mis-shaped entries.
    """
    check_names(programs.shapes, arrays.params, "checkpoint parameters")
    for what, named in (("checkpoint exp_avg", arrays.exp_avg), ("checkpoint exp_avg_sq", arrays.exp_avg_sq)):
        check_names(programs.trained_shapes, named, what)
    check_names(programs.state_shapes, arrays.buffers, "checkpoint non-trainable state")
    structure, naming = template.params, programs.naming
    adam = optax.ScaleByAdamState(count=np.asarray(arrays.step, dtype=np.int32),
                                  mu=flax_views(arrays.exp_avg, structure, naming),
                                  nu=flax_views(arrays.exp_avg_sq, structure, naming))
    return TrainState(params=flax_views(arrays.params, structure, naming),
                      opt_state=_host(with_adam_state(template.opt_state, adam)),
                      model_state=flax_views(arrays.buffers, template.model_state, programs.state_naming),
                      frozen=flax_views(arrays.params, template.frozen, naming))


def _host(tree: Any) -> Any:
    """Numpy copies of the device arrays of a tree (`host_array`); the rest (views) as they are."""
    return jax.tree.map(lambda leaf: host_array(leaf) if isinstance(leaf, jax.Array) else leaf, tree)

"""Between the TF training state and `tpuplex.protocol.PortableState` (HF names, torch layout, numpy).

Kernels (and their Adam moments) change layout on the way in and out (Dense [in, out] <-> [out, in], Conv2D
HWIO <-> OIHW); everything else keeps its layout. Batch-norm counts are int64 in the checkpoint.
Writes go through `Variable.assign` in cross-replica context, so every replica's copy gets the same value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

from tpuplex.checkpoints import check_names, from_torch_layout, to_torch_layout, torch_shape
from tpuplex.protocol import PortableState
from tpuplex_tf.step import Steps


def to_portable(steps: Steps) -> PortableState:
    """Parameters, Adam moments (of those that train) and the optimizer step as numpy arrays under HF names."""
    return PortableState(params=_read(_parameters(steps)), exp_avg=_read(_trained(steps, steps.exp_avg)),
                         exp_avg_sq=_read(_trained(steps, steps.exp_avg_sq)), step=int(steps.step.numpy()),
                         buffers={name: _portable_state(v.numpy())
                                  for name, v in zip(steps.state_names, steps.state_variables, strict=True)})


def load_params(steps: Steps, params: Mapping[str, np.ndarray], what: str) -> None:
    """Assign HF-named parameters (torch layout) to the model's variables, after checking names and shapes."""
    check_names(_hf_shapes(_parameters(steps)), params, what)
    _write(_parameters(steps), params)


def load_buffers(steps: Steps, buffers: Mapping[str, np.ndarray], what: str) -> None:
    """Assign the model's non-trainable state (an image family's batch-norm statistics) by name."""
    named_state = dict(zip(steps.state_names, steps.state_variables, strict=True))
    check_names({name: tuple(v.shape) for name, v in named_state.items()}, buffers, what)
    for name, variable in named_state.items():
        variable.assign(np.asarray(buffers[name], variable.dtype.as_numpy_dtype))


def from_portable(steps: Steps, state: PortableState) -> None:
    """Make `steps` hold exactly `state`: parameters, both moments and the step count."""
    trained = _hf_shapes(_trained(steps, steps.variables))
    check_names(_hf_shapes(_parameters(steps)), state.params, "the checkpoint's parameters")
    check_names(trained, state.exp_avg, "the checkpoint's exp_avg (Adam first moment)")
    check_names(trained, state.exp_avg_sq, "the checkpoint's exp_avg_sq (Adam second moment)")
    _write(_parameters(steps), state.params)
    _write(_trained(steps, steps.exp_avg), state.exp_avg)
    _write(_trained(steps, steps.exp_avg_sq), state.exp_avg_sq)
    load_buffers(steps, state.buffers, "the checkpoint's non-trainable state")
    steps.step.assign(state.step)


Named = Sequence[tuple[str, bool, tf.Variable]]
"""(HF name, whether the variable is the transpose of the HF tensor, variable) of each array."""


def _trained(steps: Steps, variables: Sequence[tf.Variable]) -> Named:
    """`variables` (the parameters that train, or one of their moments) named."""
    return list(zip(steps.names, steps.transposed, variables, strict=True))


def _parameters(steps: Steps) -> Named:
    """Every parameter, those that train and the frozen ones."""
    return [*_trained(steps, steps.variables), *steps.frozen]


def _hf_shapes(named: Named) -> dict[str, tuple[int, ...]]:
    """HF name -> torch-layout shape."""
    return {name: torch_shape(tuple(v.shape)) if transposed else tuple(v.shape) for name, transposed, v in named}


def _read(named: Named) -> dict[str, np.ndarray]:
    return {name: to_torch_layout(v.numpy()) if transposed else v.numpy() for name, transposed, v in named}


def _write(named: Named, arrays: Mapping[str, np.ndarray]) -> None:
    for name, transposed, variable in named:
        array = np.asarray(arrays[name], np.float32)
        variable.assign(from_torch_layout(array) if transposed else array)


def _portable_state(array: np.ndarray) -> np.ndarray:
    return array.astype(np.int64) if np.issubdtype(array.dtype, np.integer) else array

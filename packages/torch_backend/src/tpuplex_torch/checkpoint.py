"""The training state to and from `tpuplex.protocol.PortableState`.

Parameters keep their HF names and torch layout, so they cross over unchanged; torch AdamW's per-parameter state
`exp_avg`, `exp_avg_sq` and `step` maps to the portable moments and step. A fresh state is restored from
`initial(params)` the same way as a checkpoint, so Adam's state exists before the first step (torch would create
it inside it, making the first step's XLA program differ from the rest), and every tensor is uploaded from the
host, never computed on the device, so restoring compiles nothing. An FSDP2 state is written from each process's
own shards (`to_slices`) and restored by each process reading only its shards' blocks, so no process holds it
whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

import torch
from tpuplex import sharding
from tpuplex.checkpoints import check_names
from tpuplex.protocol import PortableState
from tpuplex.slices import Filled, Slice, SliceReader
from tpuplex_torch.devices import Placement
from tpuplex_torch.step import TorchState


def initial(params: Mapping[str, np.ndarray], buffers: Mapping[str, np.ndarray],
            frozen: frozenset[str] = frozenset()) -> PortableState:
    """The state before training: `params` and `buffers`, zero moments of those not `frozen` (made a shard at a
    time), step 0."""
    zeros = {name: Filled(tuple(np.shape(array))) for name, array in params.items() if name not in frozen}
    return PortableState(params=dict(params), exp_avg=zeros, exp_avg_sq=dict(zeros), step=0, buffers=dict(buffers))


def to_portable(state: TorchState) -> PortableState:
    """Parameters and Adam moments (SGD: the momentum buffer as exp_avg, exp_avg_sq zero) as float32 numpy arrays
    under HF names, and the optimizer step."""
    return _read_state(state, _snapshot, np.zeros_like)


def to_slices(state: TorchState, process_index: int) -> PortableState:
    """What this process writes to a checkpoint, as `to_portable` names it: of an FSDP2 parameter and its moments,
    this process's shard (unless another process holds the same shard: HSDP's data axis), of a whole tensor, the
    whole on process 0."""
    def held(tensor: torch.Tensor) -> list[Slice]:
        if not isinstance(tensor, DTensor):
            return [Slice.whole(_snapshot(tensor))] if process_index == 0 else []
        coordinate = tensor.device_mesh.get_coordinate()
        if any(isinstance(p, Replicate) and c != 0 for p, c in zip(tensor.placements, coordinate, strict=True)):
            return []
        _, start = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
        local = _snapshot(tensor.to_local())
        return [Slice(tuple(tensor.shape), tuple(start), local)] if local.size else []

    def zeros(slices: list[Slice]) -> list[Slice]:
        return [Slice(piece.shape, piece.start, np.zeros_like(piece.data)) for piece in slices]

    return _read_state(state, held, zeros)


def _read_state(state: TorchState, read: Callable[[torch.Tensor], Any], zeros: Callable[[Any], Any]) -> PortableState:
    """The portable state with every tensor as `read` gives it (SGD's missing second moment: `zeros` of the
    parameter's)."""
    params, exp_avg, exp_avg_sq = {}, {}, {}
    sgd = isinstance(state.optimizer, torch.optim.SGD)
    _reshard(state.model)
    for name, parameter in state.model.named_parameters():
        params[name] = read(parameter)
        if not parameter.requires_grad:
            continue
        moments = state.optimizer.state[parameter]
        exp_avg[name] = read(moments["momentum_buffer" if sgd else "exp_avg"])
        exp_avg_sq[name] = zeros(params[name]) if sgd else read(moments["exp_avg_sq"])
    buffers = {name: read(buffer) for name, buffer in _buffers(state).items()}
    return PortableState(params=params, exp_avg=exp_avg, exp_avg_sq=exp_avg_sq, step=state.step, buffers=buffers)


def _snapshot(tensor: torch.Tensor) -> np.ndarray:
    """A numpy copy of `tensor` (one copy, from any device): on the CPU `.numpy()` alone would share the memory
    the next step updates. An FSDP2 shard is gathered whole first (collective: every process calls it)."""
    if isinstance(tensor, DTensor):
        tensor = tensor.full_tensor()
    return tensor.detach().to("cpu", copy=True).numpy()


def _reshard(model: torch.nn.Module) -> None:
    """Register FSDP2's sharded parameters again (the optimizer's keys): after an evaluation's forward the root keeps
    its parameters gathered, as it would for a backward."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def local_state_bytes(state: TorchState, placement: Placement) -> int:
    """Bytes of parameters and optimizer moments one device holds (its shards, or the whole)."""
    held = list(state.model.parameters())
    held += [t for moments in state.optimizer.state.values() for t in moments.values()
             if isinstance(t, torch.Tensor) and t.dim() > 0]
    return sum(placement.held_bytes(tensor) for tensor in held)


def _upload_like(placement: Placement, array: SliceReader, current: torch.Tensor,
                 layout: sharding.Layout) -> torch.Tensor:
    """A host array as a tensor laid out as `current`: of an FSDP2 parameter, this process's shard (read alone,
    no communication), else the whole in `current`'s memory format (split as `layout` says under torch_xla)."""
    if not isinstance(current, DTensor):
        return _like(placement.upload(array, layout), current)
    size, start = compute_local_shape_and_global_offset(current.shape, current.device_mesh, current.placements)
    block = array[tuple(slice(first, first + n) for first, n in zip(start, size, strict=True))]
    return DTensor.from_local(placement.upload(block), current.device_mesh, current.placements, run_check=False,
                              shape=current.shape, stride=current.stride())


def _buffers(state: TorchState) -> dict[str, torch.Tensor]:
    """The model's non-trainable state that checkpoints carry (`TorchState.buffer_names`)."""
    named = dict(state.model.named_buffers())
    return {name: named[name] for name in state.buffer_names}


def _like(uploaded: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """`uploaded` in the memory format `current` has: convolution kernels stay channels-last."""
    if current.dim() == 4 and current.is_contiguous(memory_format=torch.channels_last):
        return uploaded.contiguous(memory_format=torch.channels_last)
    return uploaded


def restore(state: TorchState, portable: PortableState, placement: Placement) -> TorchState:
    """Overwrite `state` with `portable`; TpuplexError names any missing, unexpected or mis-shaped array."""
    _reshard(state.model)
    named = dict(state.model.named_parameters())
    expected = {name: tuple(parameter.shape) for name, parameter in named.items()}
    trained = {name: shape for name, shape in expected.items() if named[name].requires_grad}
    check_names(expected, portable.params, "the checkpoint's parameters")
    check_names(trained, portable.exp_avg, "the checkpoint's exp_avg moments")
    check_names(trained, portable.exp_avg_sq, "the checkpoint's exp_avg_sq moments")
    sgd = isinstance(state.optimizer, torch.optim.SGD)
    # AdamW keeps its step count on the CPU, the fused kernel on the parameters' device.
    step_device = placement.device if state.optimizer.defaults.get("fused") else "cpu"
    for name, parameter in named.items():
        layout = sharding.layout(name, expected[name], placement.topology.mesh)
        if isinstance(parameter, DTensor):  # FSDP2 keeps its own storage for the shard: copy into it
            parameter.data.copy_(_upload_like(placement, portable.params[name], parameter.data, layout))
        else:
            parameter.data = _upload_like(placement, portable.params[name], parameter.data, layout)
        if name not in trained:
            continue
        if sgd:  # a zero buffer makes the first update's buffer the gradient itself, as torch's first step does
            state.optimizer.state[parameter] = {
                "momentum_buffer": _upload_like(placement, portable.exp_avg[name], parameter.data, layout)}
            continue
        state.optimizer.state[parameter] = {
            "step": torch.tensor(float(portable.step), dtype=torch.float32, device=step_device),
            # The moments in the parameter's memory format and layout: the fused update takes tensors of one layout.
            "exp_avg": _upload_like(placement, portable.exp_avg[name], parameter.data, layout),
            "exp_avg_sq": _upload_like(placement, portable.exp_avg_sq[name], parameter.data, layout),
        }
    buffers = _buffers(state)
    check_names({name: tuple(b.shape) for name, b in buffers.items()}, portable.buffers,
                "the checkpoint's non-trainable state")
    for name, buffer in buffers.items():
        buffer.data = torch.from_numpy(np.array(portable.buffers[name])).to(placement.device, buffer.dtype)
    state.step = portable.step
    return state

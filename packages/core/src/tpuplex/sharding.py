"""The device mesh and where each parameter lives on it, decided once in the core; the backends only apply it.

A run's devices form a mesh with three named axes (docs/sharding.md):

    data    the batch is split over it; parameters are replicated along it
    fsdp    the batch is split over it too, and every large parameter and both Adam moments are split along it
            (ZeRO-3 / FSDP: a device holds 1/fsdp of the state and gathers a layer's weights when it runs it)
    tensor  Megatron-style: attention and MLP weights split by their family's roles; the batch is not split

`runtime.mesh = {data = -1, fsdp = 4}` asks for one (`-1` fills with the devices left); the default, `{}`, is pure
data parallelism over every device. A `Layout` says, for each dimension of a parameter in its portable (torch)
layout, which mesh axis splits it (None: not split), so the three backends shard one tensor the same way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from tpuplex.errors import ConfigError, MeshError

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor")
"""The mesh's axes, outermost first: devices that share a `data` index are neighbours (a host's chips on a pod)."""
BATCH_AXES: tuple[str, ...] = ("data", "fsdp")
"""The axes a batch's rows are split over (`Mesh.batch_shards` of them)."""

MIN_SHARDED_ELEMENTS = 2**14
"""A parameter with fewer elements (biases, norms, a small head) stays whole on every device: splitting 64 KiB
saves less memory than the gather it costs in latency (big_vision and MaxText leave such tensors replicated too)."""

Layout = tuple[str | None, ...]
"""Per dimension of a parameter (portable, torch layout), the mesh axis that splits it, or None."""

TENSOR_ROLES = ("column", "row")
"""Megatron's split of a transformer block (`DecoderFamily.tensor_roles`, `Family.tensor_roles`, over canonical
names): the projections into heads and into the MLP split their outputs ("column"), the projections back split their
inputs ("row"), so a block needs one reduction per half. A family turns each role into a dimension of the portable
weight (`tensor_dims`), which depends on its kernel layout ([out, in], or GPT-2's [in, out])."""


@dataclasses.dataclass(frozen=True)
class Mesh:
    """The sizes of the mesh's axes; their product is the number of devices of all processes."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    @property
    def shape(self) -> tuple[int, ...]:
        """The axes' sizes in MESH_AXES order."""
        return self.data, self.fsdp, self.tensor

    @property
    def batch_shards(self) -> int:
        """Devices the global batch is split over (data x fsdp): each takes B / batch_shards rows."""
        return self.data * self.fsdp

    @property
    def shards_parameters(self) -> bool:
        return self.fsdp > 1 or self.tensor > 1

    def report(self) -> str:
        """`data=2 fsdp=4` (axes of size 1 left out but data)."""
        return " ".join(f"{axis}={size}" for axis, size in zip(MESH_AXES, self.shape, strict=True)
                        if size > 1 or axis == "data")


def check_request(request: Mapping[str, Any]) -> None:
    """A TpuplexError naming the first problem of a `runtime.mesh` table: unknown axes, sizes that are not positive
    integers (or -1), or more than one -1."""
    for axis, size in request.items():
        if axis not in MESH_AXES:
            raise ConfigError(f"runtime.mesh has the axis {axis!r}: the axes are {', '.join(MESH_AXES)} "
                              "(e.g. runtime.mesh = {data = -1, fsdp = 4})")
        if isinstance(size, bool) or not isinstance(size, int) or not (size > 0 or size == -1):
            raise ConfigError(f"runtime.mesh.{axis} = {size!r} is not allowed: use a positive integer, or -1 for "
                              "the devices the other axes leave")
    if sum(size == -1 for size in request.values()) > 1:
        raise ConfigError(f"runtime.mesh = {dict(request)} has more than one -1: let one axis fill with the devices "
                          "left and give the others their sizes")


def asks_to_shard(request: Mapping[str, int]) -> bool:
    """Whether a checked `runtime.mesh` table splits parameters (fsdp or tensor other than 1; a -1 there may)."""
    return any(request.get(axis, 1) != 1 for axis in ("fsdp", "tensor"))


def resolve(request: Mapping[str, int], devices: int, fix: str = "") -> Mesh:
    """The mesh `request` (a checked `runtime.mesh`) asks for over `devices` devices of all processes; `data` fills
    with the devices left when no axis is -1 and `data` is not given. A mesh that does not fit is a `MeshError`
    whose fix is `fix` when given ("{wanted}" in it: the fewest devices the mesh fits, e.g. the processes a backend
    of one device per process needs), else "make the axes multiply to the device count"."""
    sizes = {axis: request.get(axis, 1) for axis in MESH_AXES}
    if -1 not in request.values() and "data" not in request:
        sizes["data"] = -1
    fixed = math.prod(size for size in sizes.values() if size != -1)
    filled = [axis for axis, size in sizes.items() if size == -1]
    if filled:
        if devices % fixed:
            raise _mismatch(request, devices, f"the other axes' {fixed} does not divide them", fix, fixed)
        sizes[filled[0]] = devices // fixed
    elif fixed != devices:
        raise _mismatch(request, devices, f"its axes multiply to {fixed}", fix, fixed)
    return Mesh(**sizes)


def _mismatch(request: Mapping[str, int], devices: int, why: str, fix: str, wanted: int) -> MeshError:
    fix = fix.format(wanted=wanted) if fix else "make the axes multiply to the device count, or let one be -1"
    problem = f"runtime.mesh = {dict(request)} does not fit the {devices} device(s) of this run ({why})"
    return MeshError(f"{problem}: {fix}", problem)


def layout(name: str, shape: tuple[int, ...], mesh: Mesh, tensor_dim: int | None = None) -> Layout:
    """Which mesh axis splits each dimension of the parameter `name` (HF name, portable `shape`).

    tensor: `tensor_dim`, the dimension the family's Megatron role gives the weight (`TENSOR_ROLES`; None: it has
    none), when that dimension divides.
    fsdp: the largest remaining dimension that fsdp divides (the first of equals), for parameters of at least
    MIN_SHARDED_ELEMENTS; anything else stays whole (replicated).
    """
    axes: list[str | None] = [None] * len(shape)
    if mesh.tensor > 1 and tensor_dim is not None and shape[tensor_dim] % mesh.tensor == 0:
        axes[tensor_dim] = "tensor"
    if mesh.fsdp > 1 and math.prod(shape) >= MIN_SHARDED_ELEMENTS:
        free = [d for d in range(len(shape)) if axes[d] is None and shape[d] % mesh.fsdp == 0]
        if free:
            axes[max(free, key=lambda d: (shape[d], -d))] = "fsdp"
    return tuple(axes)


def layouts(shapes: Mapping[str, tuple[int, ...]], mesh: Mesh,
            tensor_dims: Mapping[str, int] | None = None) -> dict[str, Layout]:
    """`layout` of every parameter in `shapes` (portable name -> portable shape); tensor_dims: portable name -> the
    dimension its tensor-parallel role splits (`ModelKind.tensor_dims`)."""
    dims = tensor_dims or {}
    return {name: layout(name, tuple(shape), mesh, dims.get(name)) for name, shape in shapes.items()}


def shard_bytes(shape: tuple[int, ...], layout_: Layout, mesh: Mesh, itemsize: int = 4) -> int:
    """Bytes of one device's shard of a parameter of `shape` laid out as `layout_`."""
    sizes = dict(zip(MESH_AXES, mesh.shape, strict=True))
    return itemsize * math.prod(size // sizes[axis] if axis else size for size, axis in zip(shape, layout_,
                                                                                          strict=True))

"""Devices as JAX sees them: which platform, how many, arranged in which mesh, and whether the core's discovery
agrees.

`select_devices(runtime)` is called once per backend. It starts `jax.distributed` when the environment describes a
multi-host job, honours `runtime.device` and `runtime.cpu_devices`, and returns the device mesh the steps run on
(every process's devices, laid out as `runtime.mesh` asks, `tpuplex.sharding`) with the matching `Topology`.
"""

from __future__ import annotations

import os
import re
import warnings

import numpy as np
from jax.experimental import mesh_utils

import jax
from tpuplex import sharding
from tpuplex.config import RuntimeConfig
from tpuplex.errors import MeshError, TpuplexError
from tpuplex.hardware import OVERRIDE_ENV, Topology, discover

DETAIL = "jax.jit GSPMD"
_GPU_PLATFORMS = ("gpu", "cuda", "rocm")
_FORCED_CPU_COUNT = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def select_devices(runtime: RuntimeConfig) -> tuple[jax.sharding.Mesh, Topology]:
    """The device mesh and its Topology, or a TpuplexError naming the mismatch and the fix."""
    if runtime.cpu_devices > 0 and runtime.device in ("gpu", "tpu"):
        raise TpuplexError(
            f"runtime.cpu_devices = {runtime.cpu_devices} splits the CPU, but runtime.device = {runtime.device!r}: "
            "set runtime.device = \"cpu\" (or \"auto\") to test on CPU devices, or runtime.cpu_devices = 0"
        )
    requested = runtime.device if runtime.device != "auto" else os.environ.get(OVERRIDE_ENV) or "auto"
    found = discover(requested)  # raises when the asked-for kind is not on this machine
    on_cpu = runtime.cpu_devices > 0 or requested == "cpu"
    if on_cpu:
        _split_cpu(runtime.cpu_devices)  # before jax.distributed, which fixes each process's devices
    _initialize_distributed(found, runtime.start_timeout)
    devices = _cpu_devices(runtime.cpu_devices) if on_cpu else _platform_devices(found, explicit=requested != "auto")
    kind = platform_kind(devices[0])
    mesh = sharding.resolve(runtime.mesh, len(devices))
    topology = Topology(kind=kind, device_count=len(devices), host_count=jax.process_count(),
                        process_index=jax.process_index(), source=f"jax.devices({kind!r})", detail=DETAIL,
                        chip=devices[0].device_kind, mesh=mesh)
    return jax.sharding.Mesh(_arrange(devices, mesh.shape), sharding.MESH_AXES), topology


def _arrange(devices: list[jax.Device], shape: tuple[int, ...]) -> np.ndarray:
    """The devices as an array of the mesh's `shape`: on TPUs and GPUs in the order of their interconnect
    (`mesh_utils`, so the inner axes' collectives stay on the fastest links); CPU devices as they come, each
    process's together."""
    if devices[0].platform == "cpu" or jax.process_count() > 1:
        return np.array(devices).reshape(shape)
    return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)


def platform_kind(device: jax.Device) -> str:
    """"tpu", "gpu" or "cpu" for a JAX device (CUDA and ROCm devices are both "gpu")."""
    return "gpu" if device.platform in _GPU_PLATFORMS else device.platform


def _initialize_distributed(found: Topology, timeout: float) -> None:
    """Join the multi-process run the environment describes: a TPU pod or cluster that JAX detects by itself, or
    JAX_COORDINATOR_ADDRESS with JAX_NUM_PROCESSES and JAX_PROCESS_ID (what `tpuplex launch` sets). CPU devices
    of several processes reduce over gloo."""
    processes = int(os.environ.get("JAX_NUM_PROCESSES", "0") or 0)
    multi_host = (found.host_count > 1 or processes > 1 or bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))
                  or int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1
                  or int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1)
    if not multi_host or jax.distributed.is_initialized():
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    given = {"num_processes": processes, "process_id": int(os.environ.get("JAX_PROCESS_ID", "0"))} if processes else {}
    try:
        jax.distributed.initialize(**given, initialization_timeout=max(1, int(timeout)))
    except (RuntimeError, ValueError) as error:
        raise TpuplexError(
            f"this looks like a multi-host job ({found.report()}) but jax.distributed.initialize failed "
            f"({str(error).splitlines()[0]}): start every host with the same command, or set "
            "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID"
        ) from None


def _split_cpu(count: int) -> None:
    """Ask for `count` CPU devices per process when JAX has not started yet and XLA_FLAGS does not already choose
    a count (otherwise the devices JAX has are used, see `_cpu_devices`)."""
    if count > 0 and not _FORCED_CPU_COUNT.search(os.environ.get("XLA_FLAGS", "")):
        try:
            jax.config.update("jax_num_cpu_devices", count)
        except RuntimeError:
            pass  # JAX has started; its CPU devices are fixed


def _cpu_devices(count: int) -> list[jax.Device]:
    """`count` CPU devices of this process (0: all JAX has), and the same number of every other process's."""
    available = jax.devices("cpu")
    local = [device for device in available if device.process_index == jax.process_index()]
    if count > len(local):
        raise MeshError(
            f"runtime.cpu_devices = {count} but JAX already runs with {len(local)} CPU device(s): set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={count} before the process starts, "
            f"or use at most {len(local)}",
            f"runtime.cpu_devices = {count}, but JAX already runs with {len(local)} CPU device(s)")
    if count == 0 or count == len(local):
        return available
    if jax.process_count() > 1:
        raise MeshError(f"runtime.cpu_devices = {count} but every process of this run has {len(local)} CPU "
                        f"devices: set runtime.cpu_devices = {len(local)}, or 0")
    return available[:count]


def _platform_devices(found: Topology, explicit: bool) -> list[jax.Device]:
    """The devices of the asked-for platform (explicit) or of JAX's default one, checked against the core's discovery.

    With runtime.device = "auto" JAX's default platform is used; when the core found a TPU or GPU that JAX cannot
    use (a CPU-only jaxlib), that is an error rather than a silent fall back to the CPU.
    """
    kind = found.kind if explicit else platform_kind(jax.devices()[0])
    try:
        devices = jax.devices(kind)
    except RuntimeError as error:
        raise TpuplexError(
            f"the core found {found.report()} but JAX cannot use it ({str(error).splitlines()[0]}): "
            f"pip install './packages/jax_backend[{found.kind}]' (the jaxlib build for {found.kind.upper()}), "
            "or set runtime.device = \"cpu\""
        ) from None
    if found.kind != "cpu" and kind != found.kind:
        raise TpuplexError(
            f"the core found {found.report()} but JAX only sees {kind} devices: pip install "
            f"'./packages/jax_backend[{found.kind}]' (the jaxlib build for {found.kind.upper()}), or set "
            f"runtime.device = \"{kind}\""
        )
    if kind != "cpu" and found.kind == kind and found.device_count != len(devices):
        warnings.warn(
            f"the core counted {found.device_count} {kind} device(s) ({found.source}) but JAX sees {len(devices)}; "
            "using JAX's count", stacklevel=3)
    return devices

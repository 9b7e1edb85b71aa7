"""Device discovery without importing any ML framework.

`discover()` reads the environment and the device files that TPU VMs and NVIDIA drivers expose, so the core can
say what hardware is there (and which backend mode fits) before any framework claims it. Backends later report the
devices as their framework sees them, in the same `Topology` value.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import Literal

from tpuplex.errors import ConfigError
from tpuplex.sharding import Mesh

DeviceKind = Literal["tpu", "gpu", "cpu"]
DEVICE_KINDS: tuple[str, ...] = ("tpu", "gpu", "cpu")
OVERRIDE_ENV = "TPUPLEX_DEVICE"

_TPU_ENV = ("TPU_NAME", "TPU_ACCELERATOR_TYPE", "COLAB_TPU_ADDR", "TPU_WORKER_HOSTNAMES", "KAGGLE_TPU")


@dataclasses.dataclass(frozen=True)
class Topology:
    """Devices available to a run.

    kind: "tpu", "gpu" or "cpu".
    device_count: devices (replicas) across all hosts; the global batch is split over these.
    host_count: processes taking part (one per host on a TPU pod, one per device under torchrun).
    process_index: this process's index among them.
    source: how the devices were found, e.g. "env TPU_NAME", "nvidia-smi", "jax.devices()".
    detail: backend-specific mode, e.g. "MirroredStrategy", "torch_xla SPMD", "jax.jit GSPMD".
    chip: the devices' name as the framework gives it ("NVIDIA H100 80GB HBM3", "TPU v4"; "" when it gives none),
        for the peak FLOP/s (`tpuplex.flops`).
    mesh: how the devices are arranged (`tpuplex.sharding.Mesh`); None: data parallelism over all of them.
    """

    kind: DeviceKind
    device_count: int
    host_count: int = 1
    process_index: int = 0
    source: str = ""
    detail: str = ""
    chip: str = ""
    mesh: Mesh | None = None

    @property
    def batch_shards(self) -> int:
        """Devices the global batch is split over: the mesh's data x fsdp, or every device."""
        return self.mesh.batch_shards if self.mesh else self.device_count

    def report(self) -> str:
        """One line for logs: `tpu x8 (1 process) via env TPU_NAME [TPUStrategy] mesh data=2 fsdp=4`, or `cpu x4
        (process 0 of 4) via ...` for one of several processes (on one machine or many: the count says no more)."""
        processes = f"process {self.process_index} of {self.host_count}" if self.host_count > 1 else "1 process"
        line = f"{self.kind} x{self.device_count} ({processes}) via {self.source or '?'}"
        line = f"{line} [{self.detail}]" if self.detail else line
        return f"{line} mesh {self.mesh.report()}" if self.mesh else line


def discover(override: str | None = None, env: Mapping[str, str] | None = None) -> Topology:
    """What hardware this machine has, from the environment and device files; never imports a framework.

    `override` (the config's `runtime.device`) or the `TPUPLEX_DEVICE` variable forces a kind ("auto" leaves the
    choice to discovery). The device count is the best the core can tell; backends confirm it.
    """
    env = os.environ if env is None else env
    requested = override if override not in (None, "", "auto") else env.get(OVERRIDE_ENV, "auto") or "auto"
    if requested not in ("auto", *DEVICE_KINDS):
        raise ConfigError(
            f"device {requested!r} is not known: use one of auto, {', '.join(DEVICE_KINDS)} "
            f"(runtime.device or {OVERRIDE_ENV})"
        )
    found = _find_tpu(env) or _find_gpu(env) or _cpu()
    if requested in ("auto", found.kind):
        return found
    if requested == "cpu":
        return dataclasses.replace(_cpu(), source=f"override (found {found.kind})")
    raise ConfigError(
        f"device {requested!r} was asked for, but none was found (this machine has {found.report()}); "
        f"set runtime.device = \"auto\" or run where a {requested.upper()} is attached"
    )


def _find_tpu(env: Mapping[str, str]) -> Topology | None:
    announced = next((name for name in _TPU_ENV if env.get(name)), None)
    chips = sorted(glob.glob("/dev/accel*")) or sorted(glob.glob("/dev/vfio/[0-9]*"))
    if announced is None and not chips:
        return None
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    host_count = max(1, len(hosts))
    per_host = len(chips) or _chips_from_accelerator_type(env.get("TPU_ACCELERATOR_TYPE", ""), host_count)
    source = f"env {announced}" if announced else "/dev/accel*"
    return Topology(
        kind="tpu",
        device_count=max(1, per_host) * host_count,
        host_count=host_count,
        process_index=int(env.get("TPU_WORKER_ID", "0") or 0),
        source=source,
    )


def _chips_from_accelerator_type(accelerator_type: str, host_count: int) -> int:
    """Chips per host from names such as `v4-8` (cores, two per chip on v2-v4) or `v5litepod-4` (chips)."""
    match = re.fullmatch(r"v(\d+)[a-z]*(?:pod)?-(\d+)", accelerator_type)
    if not match:
        return 0
    generation, count = int(match.group(1)), int(match.group(2))
    chips = count // 2 if generation <= 4 else count
    return max(1, chips // host_count)


def _find_gpu(env: Mapping[str, str]) -> Topology | None:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return None
    count, source = _nvidia_smi_count(), "nvidia-smi"
    if count == 0:
        count, source = len(glob.glob("/proc/driver/nvidia/gpus/*")), "/proc/driver/nvidia"
    if count == 0:
        return None
    if visible:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    return Topology(kind="gpu", device_count=count, source=source)


def _nvidia_smi_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def _cpu() -> Topology:
    # Read after "via" in `report`: "cpu x1 (1 host, process 0) via the fallback (no TPU or GPU found)".
    return Topology(kind="cpu", device_count=1, source="the fallback (no TPU or GPU found)")

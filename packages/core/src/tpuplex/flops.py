"""Model FLOPs of a training step, the peak of the chips it runs on, and MFU (model FLOPs utilisation).

Counting follows PaLM (appendix B) and nanoGPT's `estimate_mfu`: a matmul of an [m, k] and a [k, n] operand is
2mkn FLOPs, the backward pass costs twice the forward, so a training step is 3x its forward; attention counts its
two L x L products in full (4 L^2 d per row and layer, causal or not); element-wise work, norms, softmax and
embedding lookups are left out. Every row of a batch counts, padding rows included: they are computed. The kind
counts its network (`ModelKind.forward_flops`), the task its head (`Task.head_flops`). A model of your own is
counted by its framework (`Backend.forward_flops`: XLA's cost analysis of the lowered forward on jax, torch's
`FlopCounterMode` on torch, TensorFlow's graph profiler on tf; each as it counts, the latter two element-wise
bias additions and all), and a training step is 3x that forward too; no MFU where the framework gives no count.

The peak is the chip's dense bf16 matrix rate from `CHIP_PEAKS` (per device as the frameworks list devices: a
TPU v2/v3 core, a v4+ chip, one GPU) times the devices, whatever precision the run computes in, so MFU says how
much of the chip a run used; on a CPU it is measured (float32 matrix products through numpy's BLAS), and
`runtime.peak_tflops` overrides both.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import numpy as np

from tpuplex.hardware import Topology

CHIP_PEAKS: tuple[tuple[str, float], ...] = (
    ("h100 pcie", 756.0), ("h100 nvl", 835.0), ("h200", 989.0), ("h100", 989.0), ("gh200", 989.0),
    ("a100", 312.0), ("l4", 121.0),
    ("tpu v2", 22.5), ("tpu v3", 61.5), ("tpu v4", 275.0), ("tpu v5 lite", 197.0), ("tpu v5e", 197.0),
    ("tpu v5p", 459.0), ("tpu v5", 459.0), ("tpu v6 lite", 918.0), ("tpu v6e", 918.0),
)
"""Lower-case part of a device's name (torch.cuda.get_device_name, jax's device_kind) -> dense bf16 TFLOP/s of one
such device, from the vendors' datasheets; the first match wins, so longer names come before their prefixes."""


@dataclasses.dataclass(frozen=True)
class Peak:
    """flops_per_s: the peak of every device of the run together (0: unknown); source: where it came from."""

    flops_per_s: float
    source: str


def peak(topology: Topology, override_tflops: float = 0.0) -> Peak:
    """The run's peak FLOP/s: `override_tflops` per device when set, the chip's table entry, or on a CPU a measured
    matrix rate per process; unknown (0) for a chip the table lacks."""
    devices = topology.device_count
    if override_tflops > 0:
        return Peak(override_tflops * 1e12 * devices, f"runtime.peak_tflops = {override_tflops:g} x {devices}")
    name = topology.chip.lower()
    for part, tflops in CHIP_PEAKS:
        if part in name:
            return Peak(tflops * 1e12 * devices, f"{topology.chip}: {tflops:g} TFLOP/s bf16 dense x {devices}")
    if topology.kind == "cpu":
        measured = cpu_matmul_flops()
        return Peak(measured * topology.host_count,
                    f"cpu: {measured / 1e9:.1f} GFLOP/s measured (float32 matmul) x {topology.host_count}")
    return Peak(0.0, f"{topology.chip or topology.kind}: not in tpuplex.flops.CHIP_PEAKS (set runtime.peak_tflops)")


@functools.cache
def cpu_matmul_flops(size: int = 1024, repeats: int = 5) -> float:
    """This host's float32 matrix rate: the best of `repeats` [size, size] products through numpy's BLAS."""
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def train_flops(spec, batch, framework_forward: Callable[[], float | None] = lambda: None) -> float | None:
    """Model FLOPs of one training step on `batch`: 3x the forward of the kind's network and the task's head, or,
    for a network the kind does not count (a model of your own, head included), 3x `framework_forward()`, the
    framework's count; None when neither counts. Over a frozen base (LoRA) 2x: the backward computes the
    activations' gradients but no weight's (a slight undercount: the attention's weightless products still cost
    2x their forward backwards, and the adapters' own small products are not counted)."""
    network = spec.kind.forward_flops(spec, batch)
    if network is None:
        forward = framework_forward()
    else:
        head = spec.task.head_flops(spec, batch)
        forward = None if head is None else network + head
    return None if forward is None else (2.0 if spec.frozen else 3.0) * forward


def rates(step_flops: float | None, seconds: float, peak_flops_per_s: float) -> dict[str, float | None]:
    """`model_tflops_per_s` (FLOPs / seconds) and `mfu` (its share of the peak), to 4 significant digits; None
    where a figure is unknown, and `mfu` None above 1 as well: more FLOPs a second than the peak is no utilisation,
    it says that the peak (a CPU's measured under another load, a wrong `runtime.peak_tflops`) or the FLOP count is
    wrong, so it is left out rather than written (`above_peak` tells the two Nones apart)."""
    achieved = step_flops / seconds if step_flops is not None and seconds > 0 else None
    known = achieved is not None and peak_flops_per_s > 0
    return {"model_tflops_per_s": None if achieved is None else float(f"{achieved / 1e12:.4g}"),
            "mfu": float(f"{achieved / peak_flops_per_s:.4g}") if known and achieved <= peak_flops_per_s else None}


def above_peak(step_flops: float | None, seconds: float, peak_flops_per_s: float) -> bool:
    """Whether `rates` left the MFU out for exceeding the peak (not for an unknown count, time or peak)."""
    return step_flops is not None and seconds > 0 and 0 < peak_flops_per_s < step_flops / seconds


def transformer_layer_flops(rows: int, length: int, width: int, matmul_params: int) -> float:
    """Forward FLOPs of one transformer layer over [rows, length] tokens: its matmul weights once per token, and
    the attention's scores and weighted sum (4 L^2 width per row; width = heads x head size)."""
    return 2.0 * rows * length * matmul_params + 4.0 * rows * length * length * width


def encoder_layer_flops(rows: int, length: int, hidden: int, intermediate: int) -> float:
    """`transformer_layer_flops` of a BERT-style encoder layer (BERT's five families, ViT): four [hidden, hidden]
    attention projections and a feed-forward of two [hidden, intermediate] matrices."""
    return transformer_layer_flops(rows, length, hidden, 4 * hidden**2 + 2 * hidden * intermediate)

"""Which torch runtime a run uses, the devices it sees, and how a host batch reaches them.

`claim(runtime)` picks the mode before anything else framework-specific loads:
- xla: `runtime.torch_mode = "xla"`, or "auto" on a machine with a TPU. torch_xla runs in SPMD mode with one mesh
  over every device, shape (replicas, devices / replicas) with axes ("data", "copy"); a batch is sharded over
  "data" and repeated over "copy". `runtime.cpu_devices = N` on XLA:CPU asks for N devices (CPU_NUM_DEVICES) or,
  when the runtime already runs more, for N replicas over them.
- eager: everything else, through accelerate: the CPU, one GPU, or several GPUs (or CPU processes) with one process
  each under `accelerate launch` / torchrun, every process holding its share of the global batch's rows.
  `runtime.torch_mode = "compile"` is eager mode with the training forward and loss (and so their backward) compiled
  by torch.compile: one program per batch shape, dropout drawn from torch's own generator as in eager mode (or,
  `runtime.torch_random = "compiled"`, in Inductor's kernels). `"cuda_graphs"` compiles the same and, on a GPU,
  replays each program as one CUDA graph (torch.compile's mode "reduce-overhead"), so a step costs the host a few
  launches instead of hundreds.

A mesh (`runtime.mesh`, `tpuplex.sharding`) with `fsdp` above 1 shards parameters and Adam's moments with FSDP2
(`fully_shard` on each block and the root over a (data, fsdp) `DeviceMesh`; data above 1 too is HSDP) in eager
mode; `tensor` above 1, and `fsdp` under torch_xla, are refused in one line.

torch_xla is imported only in xla mode. accelerate (which transformers imports) imports torch_xla by itself
whenever it is installed, so eager mode sets USE_TORCH_XLA=0 before accelerate loads: one process never has two
runtimes claiming the TPU.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import datetime
import math
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch.distributed.tensor import DTensor

import torch
from tpuplex import hardware as core_devices
from tpuplex import sharding
from tpuplex.config import RuntimeConfig
from tpuplex.data.batching import check_divisible
from tpuplex.errors import MeshError, TpuplexError
from tpuplex.hardware import Topology
from tpuplex.hosts import process_rows
from tpuplex.protocol import TARGETS, Batch, batch_rows, device_dtype
from tpuplex_torch.ops import Float8Matmuls, layers

WeightedLoss = Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor]
"""(model, micro-batch) -> sum over the rows (or tokens) of weight * loss, a float32 scalar: what a placement
compiles (`Placement.compiled`) and the step differentiates."""

XLA_INSTALL = "pip install './packages/torch_backend[xla]'"
_PJRT_DEVICE = {"tpu": "TPU", "gpu": "CUDA", "cpu": "CPU"}
_XLA_KIND = {"TPU": "tpu", "CUDA": "gpu", "CPU": "cpu"}


def claim(runtime: RuntimeConfig) -> Placement:
    """The placement for `runtime`: xla or eager mode (see the module docstring), its devices confirmed."""
    found = core_devices.discover(runtime.device)  # a TPU/GPU asked for but absent fails here, naming the fix
    if runtime.torch_random == "compiled" and runtime.torch_mode not in ("compile", "cuda_graphs"):
        raise TpuplexError(f'runtime.torch_random = "compiled" draws dropout\'s masks in torch.compile\'s kernels, but '
                           f'runtime.torch_mode = "{runtime.torch_mode}" compiles nothing: set runtime.torch_mode = '
                           '"compile" or "cuda_graphs", or leave torch_random = "eager"')
    if runtime.torch_mode == "xla":
        return XlaPlacement(runtime, found, "runtime.torch_mode = xla")
    if runtime.torch_mode == "auto" and found.kind == "tpu":
        return XlaPlacement(runtime, found, f"torch_mode auto: TPU found ({found.source})")
    if found.kind == "tpu" and runtime.device == "tpu":
        raise TpuplexError(f'runtime.device = "tpu" needs torch_xla, but runtime.torch_mode = "{runtime.torch_mode}": '
                           'set runtime.torch_mode = "auto" or "xla"')
    why = (f"runtime.torch_mode = {runtime.torch_mode}" if runtime.torch_mode != "auto"
           else f"torch_mode auto: no TPU ({found.kind})")
    return EagerPlacement(runtime, found, why)


def host_tensors(batch: Batch) -> dict[str, torch.Tensor]:
    """A host batch as CPU tensors: the model's and the head's inputs as `tpuplex.protocol.device_dtype` says
    (index type int64), the task's labels int64 (float32 for regression) and weight float32 of the labels' shape
    ([B], or [B, L] per token; ones when the batch has none). A predict batch may come without labels."""
    tensors = {key: torch.from_numpy(np.ascontiguousarray(value, dtype=device_dtype(value, np.int64)))
               for key, value in batch.items() if key not in TARGETS}
    if "labels" not in batch:
        return tensors
    labels = np.asarray(batch["labels"])
    tensors["labels"] = torch.from_numpy(labels.astype(np.float32 if labels.dtype.kind == "f" else np.int64))
    weight = batch.get("weight")
    tensors["weight"] = torch.from_numpy(
        np.ones(labels.shape, np.float32) if weight is None else np.asarray(weight, dtype=np.float32))
    return tensors


class Placement(abc.ABC):
    """Where the model lives and how batches get there; the step code is the same for every mode.

    device: where parameters live. topology: the devices as torch sees them (device_count = replicas).
    replicas_in_view: replicas whose rows `put` returns (all of them under SPMD, this process's one in eager).
    row_processes: processes that each hold a different share of a batch's rows (1 under SPMD, where every
        process sees the global batch).
    """

    mode: str
    device: torch.device
    topology: Topology
    replicas_in_view: int
    row_processes: int = 1

    def building(self) -> contextlib.AbstractContextManager:
        """The context a model kind builds its module in (`tpuplex_torch.kinds`): as it is, unless `shard` will
        split the parameters (then they are made on the meta device)."""
        return contextlib.nullcontext()

    def shard(self, module: torch.nn.Module) -> torch.nn.Module:
        """`module` on `device`, its parameters laid out over the mesh (FSDP2 where the mesh has fsdp), their values
        unset until the state is restored into them."""
        return module.to(self.device)

    @property
    def shards_parameters(self) -> bool:
        return bool(self.topology.mesh and self.topology.mesh.shards_parameters)

    @property
    def gradient_scale(self) -> int:
        """What a process's loss is multiplied by before its backward: the processes whose gradients FSDP2 averages,
        so the average is the gradient of the global mean loss; 1 where the step sums them itself."""
        return self.row_processes if self.shards_parameters else 1

    def upload(self, array: np.ndarray, layout: sharding.Layout | None = None) -> torch.Tensor:
        """A float32 host array as a state tensor (parameter or moment) on `device`, whole on every replica; under
        torch_xla SPMD laid out over the mesh as `layout` says (the core's, for a parameter and its moments).
        FSDP2's shards are DTensors, made from a block of the array (`tpuplex_torch.checkpoint`)."""
        return torch.from_numpy(np.array(array, dtype=np.float32)).to(self.device)

    def float8(self) -> Float8Matmuls:
        """The float8 products of `train.fp8` on this device: torch's `_scaled_mm` on a GPU that has float8 (compute
        capability 8.9: Ada, Hopper, Blackwell), emulated in float32 elsewhere (the same numbers, no speed)."""
        try:
            import torchao  # noqa: F401
        except ImportError as missing:
            raise TpuplexError("train.fp8 runs torchao's float8 training, which is not installed: pip install "
                               "torchao (or set train.fp8 = false)") from missing
        native = self.device.type == "cuda" and torch.cuda.get_device_capability(self.device) >= (8, 9)
        return Float8Matmuls(emulate=not native)

    def hold(self, arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """`arrays` whole on this process's device (its rows may choose any of them), each marked a static input,
        so a compiled step replayed as a CUDA graph reads it where it lies instead of copying it in every time."""
        held = {name: torch.from_numpy(np.ascontiguousarray(array)).to(self.device) for name, array in arrays.items()}
        for tensor in held.values():
            torch._dynamo.mark_static_address(tensor)
        return held

    def held_bytes(self, tensor: torch.Tensor) -> int:
        """Bytes of `tensor` this process's most loaded device holds (an FSDP2 DTensor: its local shard)."""
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        return local.numel() * local.element_size()

    @abc.abstractmethod
    def put(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The rows of `batch` this process computes, as tensors on `device` (dtypes of `host_tensors`)."""

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over processes that hold different rows of the batch (identity when one view holds them all)."""
        return tensor

    def gather_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """Per-row results of every process, in global row order (identity when one view holds them all)."""
        return tensor

    def sync(self) -> None:
        """Run what has been queued (the lazy XLA graph); eager work has already run."""
        return None

    def seed(self, seed: int) -> None:
        """Seed the generator that dropout on this device draws from, and only it: `torch.manual_seed` also
        seeds every other device type torch knows, each lazily with a stack trace recorded (0.15 ms a step on
        the CPU, 0.4% of nanoGPT's CPU recipe step)."""
        if self.device.type == "cuda":
            torch.cuda.manual_seed(seed)
        else:
            torch.default_generator.manual_seed(seed)

    def autocast(self, bf16: bool) -> contextlib.AbstractContextManager:
        """bfloat16 autocast on this device when `bf16`, else a no-op context."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16)

    def compiled(self, loss: WeightedLoss) -> WeightedLoss:
        """`loss` as the train step calls it: unchanged unless the mode compiles it."""
        return loss

    replays_graphs = False
    """Whether the compiled training loss and its backward replay as CUDA graphs, whose outputs (a micro-batch's
    gradients too) live in memory the next replay writes over."""

    def begin_step(self) -> None:
        """Mark the start of an optimizer step (CUDA graphs free the previous step's outputs here)."""
        return None

    def compile_count(self) -> int:
        """Programs compiled so far: eager runs kernels as they come and compiles none."""
        return 0

    @abc.abstractmethod
    def start_profile(self, logdir: Path) -> None:
        """Start the framework's profiler trace into `logdir`."""

    @abc.abstractmethod
    def stop_profile(self) -> None:
        """Stop the trace and write it."""


class EagerPlacement(Placement):
    """Eager PyTorch through accelerate: CPU or GPU, one process per device; with `runtime.torch_mode =
    "compile"`, the training forward and loss compiled by torch.compile; with "cuda_graphs" on a GPU, replayed as
    CUDA graphs too."""

    mode = "eager"

    def __init__(self, runtime: RuntimeConfig, found: Topology, why: str):
        if runtime.cpu_devices > 1:
            raise MeshError(
                f"runtime.cpu_devices = {runtime.cpu_devices} needs torch_mode = \"xla\": eager PyTorch runs one "
                f"device per process (set runtime.torch_mode = \"xla\" with {XLA_INSTALL}, or "
                "start N processes with tpuplex launch --processes N)",
                f"runtime.cpu_devices = {runtime.cpu_devices} splits the CPU, which eager torch does not (one device "
                "per process)")
        if "torch_xla" not in sys.modules:
            os.environ["USE_TORCH_XLA"] = "0"  # read when accelerate is first imported, just below
        import accelerate

        if accelerate.utils.is_torch_xla_available():
            raise TpuplexError("torch_mode eager was asked for in a process where torch_xla is already loaded, so "
                               "accelerate would run on XLA: use one torch mode per process")
        use_gpu = found.kind == "gpu"
        if use_gpu and not torch.cuda.is_available():
            raise TpuplexError(f"a GPU was found ({found.source}) but this torch build has no CUDA: install a CUDA "
                               "build of torch, or set runtime.device = \"cpu\"")
        # The process group's timeout bounds how long a collective waits for a lost process.
        wait = accelerate.utils.InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=runtime.collective_timeout))
        self.accelerator = accelerate.Accelerator(cpu=not use_gpu, kwargs_handlers=[wait])
        self._reduce = accelerate.utils.reduce
        state = self.accelerator.state
        if torch.distributed.is_initialized():
            # Left to interpreter shutdown, gloo's worker threads can still hold tensors then, and the process aborts
            # ("terminate called without an active exception", pytorch#190489) instead of exiting with its status.
            atexit.register(state.destroy_process_group)
        self.device = self.accelerator.device
        self.row_processes = state.num_processes
        self.replicas_in_view = 1
        mesh = mesh_of(runtime, self.row_processes, one_per_process=True)
        self.device_mesh = (torch.distributed.device_mesh.init_device_mesh(
            self.device.type, (mesh.data, mesh.fsdp), mesh_dim_names=("data", "fsdp"))
            if mesh.shards_parameters else None)
        fsdp = f" + FSDP2 ({'HSDP' if mesh.data > 1 else 'fully sharded'})" if self.device_mesh else ""
        self._compiles = runtime.torch_mode in ("compile", "cuda_graphs")
        self._eager_random = runtime.torch_random == "eager"
        self.replays_graphs = runtime.torch_mode == "cuda_graphs" and self.device.type == "cuda"
        if runtime.torch_mode == "cuda_graphs" and self.device.type != "cuda":
            print(f'tpuplex: warning: runtime.torch_mode = "cuda_graphs" replays CUDA graphs on a GPU; on the '
                  f'{self.device.type} it runs as "compile"', file=sys.stderr)
        if self.replays_graphs and self.device_mesh is not None:
            raise TpuplexError(f'runtime.torch_mode = "cuda_graphs" with runtime.mesh = {runtime.mesh}: a CUDA graph '
                               "cannot hold FSDP2's gathers, which run between the compiled pieces; set "
                               'runtime.torch_mode = "compile" for a sharded mesh')
        compiled = (" + torch.compile" if self._compiles else "") + (" + CUDA graphs" if self.replays_graphs else "")
        self.topology = Topology(
            kind="gpu" if self.device.type == "cuda" else "cpu", device_count=self.row_processes,
            host_count=self.row_processes, process_index=state.process_index,
            source=f"accelerate ({state.distributed_type.value})",
            detail=f"torch eager{compiled}{fsdp}; {why}",
            chip=torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "", mesh=mesh)
        self._profiler: torch.profiler.profile | None = None
        self._graphs_before = _compiled_graphs() if self._compiles else 0
        # torch.compile's count of graphs skipped, read at the first step (`begin_step`): reading it imports
        # torch._dynamo (about 1 s), which a run without graphs never needs
        self._graphs_skipped_before: int | None = None
        self._graphs_skipped_said = False

    def shard(self, module: torch.nn.Module) -> torch.nn.Module:
        """FSDP2 over the (data, fsdp) mesh: `fully_shard` on every layer (`tpuplex_torch.ops.layers`: so one
        layer's weights are gathered at a time), then on the root; each parameter split on the dimension the core's
        layout gives it (`tpuplex.sharding.layout`; dimension 0 where the core keeps it whole, as FSDP2 splits every
        parameter). FSDP2 averages the gradients over the processes (gloo has no pre-scaled sum for a factor of
        one), so the train step scales each process's share of the global mean loss by their number
        (`gradient_scale`)."""
        if self.device_mesh is None:
            return super().shard(module)
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Shard

        mesh = self.topology.mesh
        named = {id(parameter): name for name, parameter in module.named_parameters()}

        def placement(parameter: torch.nn.Parameter) -> Shard:
            layout = sharding.layout(named[id(parameter)], tuple(parameter.shape), mesh)
            return Shard(layout.index("fsdp") if "fsdp" in layout else 0)

        shard_mesh = self.device_mesh if mesh.data > 1 else self.device_mesh["fsdp"]
        for part in (*layers(module), module):
            fully_shard(part, mesh=shard_mesh, shard_placement_fn=placement)
        # Built on the meta device (`building`): each process allocates its own shards only now. The buffers the
        # kind made (position ids, batch-norm statistics) are whole and small: kept as they were.
        buffers = [buffer.clone() for buffer in module.buffers()]
        module.to_empty(device=self.device)
        with torch.no_grad():
            for buffer, value in zip(module.buffers(), buffers, strict=True):
                buffer.copy_(value)
        return module

    def building(self) -> contextlib.AbstractContextManager:
        if self.device_mesh is None:
            return super().building()
        import accelerate

        return accelerate.init_empty_weights(include_buffers=False)

    def put(self, batch: Batch) -> dict[str, torch.Tensor]:
        """On a GPU through pinned host memory, copied without waiting: the copy queues ahead of the step's
        kernels and the host goes on to launch them."""
        mine = process_rows(batch_rows(batch), self.topology.process_index, self.row_processes)
        if self.device.type != "cuda":
            return {name: t[mine].to(self.device) for name, t in host_tensors(batch).items()}
        return {name: t[mine].pin_memory().to(self.device, non_blocking=True)
                for name, t in host_tensors(batch).items()}

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.row_processes == 1 else self._reduce(tensor, reduction="sum")

    def gather_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.row_processes == 1 else self.accelerator.gather(tensor)

    def begin_step(self) -> None:
        """Also says once if torch.compile ran one of the run's programs without its CUDA graph, which it
        otherwise does silently, from torch's own count (`_graphs_skipped`). That count misses the pieces a
        partitioned graph runs eagerly between its graphs (an operation a graph cannot hold, say): a hint, not a
        proof; the profile's `cudaGraphLaunch` calls are."""
        if not self.replays_graphs:
            return
        torch.compiler.cudagraph_mark_step_begin()
        if self._graphs_skipped_said:
            return
        if self._graphs_skipped_before is None:  # the first step: nothing of this run is compiled yet
            self._graphs_skipped_before = _graphs_skipped()
        elif skipped := _graphs_skipped() - self._graphs_skipped_before:
            print(f'tpuplex: warning: runtime.torch_mode = "cuda_graphs", but torch.compile runs at least {skipped} '
                  'of this run\'s compiled programs without a CUDA graph (as "compile"); TORCH_LOGS=cudagraphs says '
                  'why', file=sys.stderr)
            self._graphs_skipped_said = True

    def compiled(self, loss: WeightedLoss) -> WeightedLoss:
        if not self._compiles:
            return loss
        import torch._dynamo.config

        # One program per batch shape (a few fitted buckets). Past the limit dynamo would quietly run the forward
        # eagerly; failing says so instead.
        torch._dynamo.config.recompile_limit = 64
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        # Inductor's options for this program alone ("triton.cudagraphs" is what mode "reduce-overhead" sets, which
        # torch.compile takes only without options). `fallback_random` (runtime.torch_random = "eager") draws the
        # masks from torch's generator as eager mode does, each dropout then a kernel of its own.
        return torch.compile(loss, dynamic=False, options={"fallback_random": self._eager_random,
                                                           "triton.cudagraphs": self.replays_graphs})

    def compile_count(self) -> int:
        return _compiled_graphs() - self._graphs_before if self._compiles else 0

    def start_profile(self, logdir: Path) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(
            activities=activities, on_trace_ready=torch.profiler.tensorboard_trace_handler(str(logdir)))
        self._profiler.start()

    def stop_profile(self) -> None:
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None


def mesh_of(runtime: RuntimeConfig, devices: int, one_per_process: bool = False) -> sharding.Mesh:
    """The mesh `runtime.mesh` asks for over `devices`; `tensor` above 1 is refused (torch splits no weight
    Megatron's way yet). `one_per_process`: eager torch, whose devices are its processes, so a mesh that does not
    fit names the `tpuplex launch` that gives it its devices."""
    fix = ("eager torch runs one device per process: start {wanted} with tpuplex launch --processes {wanted} -- "
           "train ... (docs/sharding.md), or make the axes multiply to the device count" if one_per_process else "")
    mesh = sharding.resolve(runtime.mesh, devices, fix)
    if mesh.tensor > 1:
        raise MeshError(f"runtime.mesh = {runtime.mesh} has tensor = {mesh.tensor}, which the torch backend does "
                        "not split (it shards over fsdp): train a tensor axis with --backend jax, or move those "
                        "devices to fsdp",
                        f"runtime.mesh = {runtime.mesh} has a tensor axis, which torch does not split")
    return mesh


def _graphs_skipped() -> int:
    """Compiled programs torch.compile has run without their CUDA graph in this process (it logs why only under
    TORCH_LOGS=cudagraphs)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def _compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process (each one forward and its backward)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class XlaPlacement(Placement):
    """torch_xla in SPMD mode: one program over a mesh of every device, the batch sharded over replicas."""

    mode = "xla"

    def __init__(self, runtime: RuntimeConfig, found: Topology, why: str):
        claimed = [name for name in ("jax", "tensorflow") if name in sys.modules]
        if found.kind == "tpu" and claimed:
            raise TpuplexError(f"{claimed[0]} is already loaded in this process and may hold the TPU: run the torch "
                               "backend in a process of its own")
        kind = found.kind if runtime.device == "auto" else runtime.device
        os.environ.setdefault("PJRT_DEVICE", _PJRT_DEVICE[kind])
        try:
            import torch_xla.debug.metrics as metrics
            import torch_xla.debug.profiler as profiler
            import torch_xla.distributed.spmd as spmd
            import torch_xla.runtime as xr

            import torch_xla
        except ImportError:
            raise TpuplexError(f"runtime.torch_mode = \"xla\" (or a TPU) needs torch_xla, which is not installed: "
                               f"{XLA_INSTALL}") from None
        self._xla, self._metrics, self._profiler, self._spmd = torch_xla, metrics, profiler, spmd
        on_cpu = os.environ["PJRT_DEVICE"] == "CPU"
        if on_cpu and runtime.cpu_devices > 0 and not torch_xla._XLAC._xla_runtime_is_initialized():
            os.environ["CPU_NUM_DEVICES"] = str(runtime.cpu_devices)
        if not xr.is_spmd():
            xr.use_spmd()
        if xr.process_count() > 1:
            # The core's agreement checks and checkpoint barrier need a host collective that nobody has run on a
            # pod with this backend yet; refusing beats a run that may hang at its first checkpoint.
            raise TpuplexError(f"torch_xla runs {xr.process_count()} processes (a multi-host TPU slice), which the "
                               "torch backend does not support yet: use the jax or tf backend on a pod slice, or "
                               "one host's chips with torch")
        devices = xr.global_runtime_device_count()
        replicas = runtime.cpu_devices if on_cpu and runtime.cpu_devices > 0 else devices
        if devices % replicas:
            raise TpuplexError(
                f"runtime.cpu_devices = {replicas} does not fit the {devices} XLA CPU devices this process already "
                f"runs: use a divisor of {devices}, or start a fresh process")
        layout_mesh = mesh_of(runtime, replicas)
        self.mesh = spmd.Mesh(np.arange(devices), (*layout_mesh.shape[:2], devices // replicas),
                              ("data", "fsdp", "copy"))
        self.device = torch_xla.device()
        self.replicas_in_view = replicas
        device_type = xr.device_type() or os.environ["PJRT_DEVICE"]
        self.topology = Topology(
            kind=_XLA_KIND.get(device_type, "cpu"), device_count=replicas, host_count=xr.process_count(),
            process_index=xr.process_index(), source=f"torch_xla PJRT {device_type}",
            detail=f"torch_xla SPMD, mesh {layout_mesh.report()} x copy={devices // replicas}; {why}",
            mesh=layout_mesh)

    def upload(self, array: np.ndarray, layout: sharding.Layout | None = None) -> torch.Tensor:
        # Marked now (replicated unless the layout splits it), as the step's outputs will be: an unmarked input
        # would make the first step's program differ from every later one and compile twice.
        tensor = super().upload(array)
        self._spmd.mark_sharding(tensor, self.mesh, tuple(layout) if layout else (None,) * tensor.dim())
        return tensor

    def held_bytes(self, tensor: torch.Tensor) -> int:
        # The block the first local device holds, from the tensor's sharding alone (nothing copied off the device).
        _, index = self._xla._XLAC._get_local_shard_replica_and_indices([tensor])[0][0]
        shape = tensor.shape if index is Ellipsis else [part.stop - part.start for part in index]
        return math.prod(shape) * tensor.element_size()

    def float8(self) -> Float8Matmuls:
        raise TpuplexError("train.fp8 runs on torch's eager or compiled modes (GPUs, or emulated on the CPU), not "
                           "torch_xla: set train.fp8 = false")

    def put(self, batch: Batch) -> dict[str, torch.Tensor]:
        check_divisible(batch_rows(batch), self.replicas_in_view)
        placed = {}
        for name, tensor in host_tensors(batch).items():
            placed[name] = tensor.to(self.device)
            self._spmd.mark_sharding(placed[name], self.mesh, (sharding.BATCH_AXES,) + (None,) * (tensor.dim() - 1))
        return placed

    def sync(self) -> None:
        self._xla.sync()

    def seed(self, seed: int) -> None:
        self._xla.manual_seed(seed)

    def compile_count(self) -> int:
        data: Any = self._metrics.metric_data("CompileTime")
        return int(data[0]) if data else 0

    def start_profile(self, logdir: Path) -> None:
        self._profiler.start_trace(str(logdir))

    def stop_profile(self) -> None:
        self._profiler.stop_trace()

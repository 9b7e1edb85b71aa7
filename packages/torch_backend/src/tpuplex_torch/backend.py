"""`TorchBackend`: the `tpuplex.protocol.Backend` for PyTorch, registered as the `torch` entry point."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import numpy as np

import torch
from tpuplex.config import RuntimeConfig
from tpuplex.errors import TpuplexError
from tpuplex.hardware import Topology
from tpuplex.protocol import BackendBase, Batch, ModelSpec, OptimizerSpec, PortableState, Prompts
from tpuplex_torch import checkpoint, devices, export, step
from tpuplex_torch import kinds as kinds_torch
from tpuplex_torch import tasks as tasks_torch
from tpuplex_torch.step import TorchState


class TorchBackend(BackendBase):
    """HF transformers models on eager PyTorch (accelerate) or torch_xla SPMD; see `tpuplex_torch.devices`.

    The state is a `TorchState` updated in place: `train_step` returns the object it was given.
    """

    name: ClassVar[str] = "torch"
    shards_parameters: ClassVar[bool] = True

    def __init__(self, runtime: RuntimeConfig):
        self.placement = devices.claim(runtime)
        self._held: dict[str, torch.Tensor] = {}

    def topology(self) -> Topology:
        return self.placement.topology

    def init(self, model_spec: ModelSpec, optimizer: OptimizerSpec) -> TorchState:
        task = tasks_torch.load(model_spec.task)
        if self.placement.mode == "xla" and task.not_on_xla:
            raise TpuplexError(f"the {task.name} task does not run on torch_xla: {task.not_on_xla}; use "
                               "--backend jax on a TPU (or torch on a GPU or CPU)")
        self._kind = kinds_torch.load(model_spec)
        with self.placement.building():
            built = self._kind.build(model_spec, task, optimizer)
        for name, parameter in built.module.named_parameters():
            parameter.requires_grad_(name not in model_spec.frozen)
        module = self.placement.shard(self._batch_norm_across_processes(built.module, model_spec))
        train_loss = step.weighted_loss(built.forward, task, lambda: self.placement.autocast(optimizer.bf16))
        state = TorchState(module, step.make_optimizer(module, optimizer), optimizer, built.forward,
                           self.placement.compiled(train_loss), task, tuple(built.buffers),
                           self.placement.float8() if optimizer.fp8 else None)
        return self.state_from_arrays(state, checkpoint.initial(built.params, built.buffers, model_spec.frozen))

    def _batch_norm_across_processes(self, module: torch.nn.Module, model_spec: ModelSpec) -> torch.nn.Module:
        """Cross-replica batch norm over several processes is torch's SyncBatchNorm (GPUs only); one process, or
        torch_xla SPMD (one program over the global batch), normalises over the global batch by itself."""
        has_batch_norm = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules())
        if not has_batch_norm or self.placement.row_processes == 1 or model_spec.batch_norm != "cross_replica":
            return module
        if self.placement.device.type != "cuda":
            raise TpuplexError(f"model.batch_norm = \"cross_replica\" over {self.placement.row_processes} torch "
                               f"processes on {self.placement.device.type} is not supported (torch's SyncBatchNorm "
                               "runs on GPUs): set model.batch_norm = \"per_replica\", or use the jax or tf backend")
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)

    def train_step(self, state: TorchState, batch: Batch, learning_rate: float) -> tuple[TorchState, float]:
        return state, step.train_steps(state, self.placement, [batch], [learning_rate], self._held)[0]

    def train_steps(self, state: TorchState, batches, learning_rates) -> tuple[TorchState, list[float]]:
        return state, step.train_steps(state, self.placement, batches, learning_rates, self._held)

    @property
    def holds_data(self) -> bool:  # type: ignore[override]
        """Eager and compiled torch hold data on their device; torch_xla does not."""
        return self.placement.mode != "xla"

    def hold(self, arrays: Mapping[str, np.ndarray]) -> None:
        self._held = self.placement.hold(arrays)

    def predict(self, state: TorchState, batch: Batch) -> np.ndarray:
        return step.predict(state, self.placement, batch)

    def state_to_arrays(self, state: TorchState) -> PortableState:
        return checkpoint.to_portable(state)

    def state_to_slices(self, state: TorchState) -> PortableState:
        return checkpoint.to_slices(state, self.placement.topology.process_index)

    def state_from_arrays(self, state: TorchState, arrays: PortableState) -> TorchState:
        restored = checkpoint.restore(state, arrays, self.placement)
        self.placement.sync()
        return restored

    def generate(self, state: TorchState, prompts: Prompts) -> np.ndarray:
        return self._kind.generate(state.model, prompts)

    def export(self, state: TorchState, format: str, folder: Path, data) -> None:
        if format != "torch_export":
            super().export(state, format, folder, data)
        export.torch_export(state.model, state.task, folder, data)

    def state_bytes(self, state: TorchState) -> int:
        return checkpoint.local_state_bytes(state, self.placement)

    def compile_count(self) -> int:
        return self.placement.compile_count()

    def forward_flops(self, state: TorchState, batch: Batch) -> float | None:
        return step.forward_flops(state, self.placement, batch, self._held)

    def host_allgather(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, np.float64)
        if self.placement.row_processes == 1:
            return values[None]
        return self.placement.gather_rows(torch.from_numpy(values)[None]).numpy()

    def start_profile(self, logdir: Path) -> None:
        Path(logdir).mkdir(parents=True, exist_ok=True)
        self.placement.start_profile(Path(logdir))

    def stop_profile(self) -> None:
        self.placement.stop_profile()

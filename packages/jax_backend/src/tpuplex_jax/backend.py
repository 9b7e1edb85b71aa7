"""`JaxBackend`: the tpuplex protocol on JAX: one `jit` program per step over a device mesh (GSPMD).

A host batch [B, L] becomes one global array split over the mesh's batch axes (on a multi-host job each process
gives its contiguous B / processes rows); parameters and Adam's moments are laid out as `tpuplex.sharding` decides
(split over fsdp and tensor, or replicated); one compiled program per (step, L); losses and logits come back as
numpy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

import jax
from tpuplex import sharding
from tpuplex.config import RuntimeConfig
from tpuplex.data.batching import check_micro_batches
from tpuplex.errors import TpuplexError
from tpuplex.hardware import Topology
from tpuplex.hosts import process_rows
from tpuplex.protocol import (
    TARGETS,
    BackendBase,
    Batch,
    ModelSpec,
    OptimizerSpec,
    PortableState,
    Prompts,
    batch_rows,
    device_dtype,
    head_inputs,
)
from tpuplex_jax import checkpoint, layout, step
from tpuplex_jax import kinds as kinds_jax
from tpuplex_jax import tasks as tasks_jax
from tpuplex_jax.devices import select_devices
from tpuplex_jax.ops import Naming


@dataclasses.dataclass(frozen=True)
class _Programs:
    """What `init` builds for one model: the compiled steps, the state's layout, and what checks a batch or a
    checkpoint."""

    train: Any
    predict: Any
    max_length: int
    naming: Naming
    shapes: dict[str, tuple[int, ...]]
    trained_shapes: dict[str, tuple[int, ...]]
    state_naming: Naming
    state_shapes: dict[str, tuple[int, ...]]
    grad_accum: int
    inputs: tuple[str, ...]
    kind: Any
    network: Any
    model_inputs: Any
    state_sharding: step.TrainState


class JaxBackend(BackendBase):
    name: ClassVar[str] = "jax"
    shards_parameters: ClassVar[bool] = True
    holds_data: ClassVar[bool] = True

    def __init__(self, runtime: RuntimeConfig):
        self.runtime = runtime
        self.mesh, self._topology = select_devices(runtime)
        self.devices = list(self.mesh.devices.flat)
        self._replicated = NamedSharding(self.mesh, PartitionSpec())
        self._rows = NamedSharding(self.mesh, PartitionSpec(sharding.BATCH_AXES))
        self._compiles = step.CompileCounter()
        self._programs: _Programs | None = None
        self._held: dict[str, jax.Array] = {}

    def topology(self) -> Topology:
        return self._topology

    def init(self, model: ModelSpec, optimizer: OptimizerSpec) -> step.TrainState:
        task = tasks_jax.load(model.task)
        kind = kinds_jax.load(model)
        batch_shards = self._topology.batch_shards
        built = kind.build(model, task, optimizer, batch_shards)
        trained, frozen = step.partition_params(built.params, built.naming, model.frozen)
        tx = step.make_optimizer(optimizer, trained, built.naming)
        abstract = step.TrainState(trained, jax.eval_shape(tx.init, layout.shapes_of(trained)), built.model_state,
                                   frozen)
        shapes = built.naming.shapes(built.params)
        state_sharding = layout.state_sharding(self.mesh, tx, abstract, built.naming, shapes, self._topology.mesh,
                                               model.kind.tensor_dims())
        train = step.make_train_step(built.network, tx, optimizer.grad_accum, batch_shards, model.dropout,
                                     optimizer.seed, task.unit_losses, task.model_inputs)
        predict = step.make_predict_step(built.network, task.predict_outputs, task.model_inputs)
        self._programs = _Programs(
            train=jax.jit(train, out_shardings=(state_sharding, self._replicated), donate_argnums=(0,)),
            predict=jax.jit(predict, out_shardings=self._rows),
            max_length=built.max_length, naming=built.naming, shapes=shapes,
            trained_shapes=built.naming.shapes(trained),
            state_naming=built.state_naming, state_shapes=built.state_naming.shapes(built.model_state),
            grad_accum=optimizer.grad_accum, inputs=model.inputs, kind=kind, network=built.network,
            model_inputs=task.model_inputs, state_sharding=state_sharding)
        # Each device reads its block of the parameters (drawn by the core as it reads), and the optimizer's zeros
        # are made where they live, already split: no host or device holds a split array whole.
        params = layout.place(trained, state_sharding.params)
        opt_state = jax.jit(tx.init, out_shardings=state_sharding.opt_state)(params)
        return step.TrainState(params, opt_state, layout.place(built.model_state, state_sharding.model_state),
                               layout.place(frozen, state_sharding.frozen))

    def train_step(self, state: step.TrainState, batch: Batch, learning_rate: float) -> tuple[step.TrainState, float]:
        state, losses = self.train_steps(state, [batch], [learning_rate])
        return state, losses[0]

    def train_steps(self, state: step.TrainState, batches, learning_rates) -> tuple[step.TrainState, list[float]]:
        """The steps are dispatched one after the other and their losses read back after the last, so the device
        runs them back to back (each batch's copy to it queued behind the step before)."""
        programs = self._require_init()
        losses = []
        for batch, learning_rate in zip(batches, learning_rates, strict=True):
            rows = self._global_rows(batch, programs, programs.grad_accum, _keys(batch, programs.inputs))
            with self._compiles.watching():
                state, loss = programs.train(state, rows, np.float32(learning_rate), self._held)
            losses.append(loss.addressable_shards[0].data)
        return state, [float(np.asarray(loss)) for loss in losses]

    def hold(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Each array whole on every device (replicated), each process giving its devices their copies."""
        self._held = {name: jax.make_array_from_callback(np.shape(array), self._replicated,
                                                         lambda index, array=array: np.asarray(array)[index])
                      for name, array in arrays.items()}

    def predict(self, state: step.TrainState, batch: Batch) -> np.ndarray:
        programs = self._require_init()
        rows = self._global_rows(batch, programs, 1, _keys(batch, programs.inputs))
        with self._compiles.watching():
            outputs = programs.predict(state.network_params, state.model_state, rows)
        return layout.host_array(outputs)

    def state_to_arrays(self, state: step.TrainState) -> PortableState:
        programs = self._require_init()
        return checkpoint.to_portable(state, programs.naming, programs.state_naming)

    def state_to_slices(self, state: step.TrainState) -> PortableState:
        programs = self._require_init()
        return checkpoint.to_slices(state, programs.naming, programs.state_naming)

    def state_from_arrays(self, state: step.TrainState, arrays: PortableState) -> step.TrainState:
        programs = self._require_init()
        restored = checkpoint.from_portable(arrays, state, programs)  # host views; `state` gave only the structure
        for leaf in jax.tree.leaves(state):  # freed before the restored state is placed: never both on the devices
            if isinstance(leaf, jax.Array) and not leaf.is_deleted():
                leaf.delete()
        return self._place(restored)

    def generate(self, state: step.TrainState, prompts: Prompts) -> np.ndarray:
        programs = self._require_init()
        return programs.kind.generate(programs.network, state.network_params, prompts)

    def state_bytes(self, state: step.TrainState) -> int:
        adam = step.adam_state(state.opt_state)
        return layout.bytes_per_device((state.params, state.frozen, adam.mu, adam.nu))

    def compile_count(self) -> int:
        return self._compiles.count

    def forward_flops(self, state: step.TrainState, batch: Batch) -> float | None:
        programs = self._require_init()
        rows = {name: np.asarray(batch[name]) for name in _keys(batch, programs.inputs) if name not in TARGETS}
        return step.forward_flops(programs.network, programs.model_inputs, state.network_params, state.model_state,
                                  {**rows, **self._held})

    def host_allgather(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, np.float64)
        if jax.process_count() == 1:
            return values[None]
        return np.asarray(multihost_utils.process_allgather(values), np.float64)

    def start_profile(self, logdir: Path) -> None:
        # The Perfetto (Chrome trace) JSON beside TensorBoard's xplane: readable without TensorBoard.
        jax.profiler.start_trace(str(logdir), create_perfetto_trace=True)

    def stop_profile(self) -> None:
        jax.profiler.stop_trace()

    def _require_init(self) -> _Programs:
        if self._programs is None:
            raise TpuplexError("the JAX backend has no model yet: call backend.init(model, optimizer) first")
        return self._programs

    def _place(self, state: step.TrainState) -> step.TrainState:
        """A host (numpy) state -> device arrays laid out as the steps take and return it; each device receives
        only its own slices."""
        return layout.place(state, self._require_init().state_sharding)

    def _global_rows(self, batch: Batch, programs: _Programs, grad_accum: int,
                     keys: tuple[str, ...]) -> dict[str, jax.Array]:
        """A global batch [B, ...] as arrays split over the mesh's batch axes, from this process's rows."""
        global_batch = batch_rows(batch)
        check_micro_batches(global_batch, self._topology.batch_shards, grad_accum, self._topology.mesh)
        # A batch of rows the devices hold (`hold`) carries their indices instead of the model's inputs.
        length = np.shape(batch[programs.inputs[0]])[1] if programs.inputs[0] in batch else 0
        if length > programs.max_length:
            raise TpuplexError(
                f"batches of length {length} exceed the model's {programs.max_length} positions: set "
                f"data.max_length to at most {programs.max_length}")
        mine = process_rows(global_batch, jax.process_index(), jax.process_count())
        rows = {name: np.asarray(batch[name])[mine] for name in keys}
        rows = {name: value if name in TARGETS else value.astype(device_dtype(value, np.int32), copy=False)
                for name, value in rows.items()}
        if "labels" in rows:
            rows.setdefault("weight", np.ones(rows["labels"].shape, np.float32))
        return {name: jax.make_array_from_process_local_data(self._rows, value, (global_batch, *value.shape[1:]))
                for name, value in rows.items()}


def _keys(batch: Batch, inputs: tuple[str, ...]) -> tuple[str, ...]:
    """The batch's model inputs, the task's targets (labels, and weight when given) and the head's inputs (and the
    entries that choose rows of what the devices hold)."""
    return (*(key for key in inputs if key in batch), *(key for key in TARGETS if key in batch),
            *head_inputs(batch, inputs))

"""`TfBackend`: the tpuplex protocol on TensorFlow (registered as the `tf` entry point of `tpuplex.backends`)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import keras
import numpy as np
import tensorflow as tf

from tpuplex.config import RuntimeConfig
from tpuplex.hardware import Topology
from tpuplex.protocol import BackendBase, Batch, ModelSpec, OptimizerSpec, PortableState, Prompts
from tpuplex_tf import checkpoint, export
from tpuplex_tf import kinds as kinds_tf
from tpuplex_tf import tasks as tasks_tf
from tpuplex_tf.devices import build_strategy, use_xla
from tpuplex_tf.step import Steps


@dataclasses.dataclass
class TfState:
    """The opaque training state: the Keras model and its compiled steps with the AdamW state (in place)."""

    steps: Steps


class TfBackend(BackendBase):
    """TensorFlow backend: TPUStrategy / MirroredStrategy / OneDeviceStrategy and XLA-compiled steps.

    Constructing it initialises TensorFlow's devices for `runtime` (see `tpuplex_tf.devices`).
    """

    name: ClassVar[str] = "tf"

    def __init__(self, runtime: RuntimeConfig):
        self.runtime = runtime
        self.strategy, topology = build_strategy(runtime)
        self.jit_compile = use_xla(topology)
        xla = "XLA on" if self.jit_compile else "XLA off"
        self._topology = dataclasses.replace(topology, detail=f"{topology.detail}, {xla}")
        self._steps: list[Steps] = []
        self._gather_replicas = tf.function(self._replica_values)

    def topology(self) -> Topology:
        return self._topology

    def init(self, model_spec: ModelSpec, optimizer: OptimizerSpec) -> TfState:
        task = tasks_tf.load(model_spec.task)
        with self.strategy.scope(), dtype_policy("mixed_bfloat16" if optimizer.bf16 else "float32"):
            self._kind = kinds_tf.load(model_spec)
            built = self._kind.build(model_spec, task, optimizer)
            steps = Steps(self.strategy, built, optimizer, task, model_spec.inputs, self.jit_compile,
                          model_spec.frozen)
        checkpoint.load_params(steps, built.params, "the initial parameters")
        checkpoint.load_buffers(steps, built.buffers, "the initial batch-norm statistics")
        self._steps.append(steps)
        return TfState(steps)

    def train_step(self, state: TfState, batch: Batch, learning_rate: float) -> tuple[TfState, float]:
        state, (loss,) = self.train_steps(state, [batch], [learning_rate])
        return state, loss

    def train_steps(self, state: TfState, batches: Sequence[Batch],
                    learning_rates: Sequence[float]) -> tuple[TfState, list[float]]:
        return state, state.steps.train(batches, learning_rates)

    def predict(self, state: TfState, batch: Batch) -> np.ndarray:
        return state.steps.predict(batch)

    def forward_flops(self, state: TfState, batch: Batch) -> float | None:
        return state.steps.forward_flops(batch)

    def state_to_arrays(self, state: TfState) -> PortableState:
        return checkpoint.to_portable(state.steps)

    def state_from_arrays(self, state: TfState, arrays: PortableState) -> TfState:
        checkpoint.from_portable(state.steps, arrays)
        return state

    def compile_count(self) -> int:
        """Traces of the training and prediction tf.functions: one program per (kind, batch shape)."""
        return sum(steps.traces for steps in self._steps)

    def host_allgather(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, np.float64)
        processes = self._topology.host_count
        if processes == 1:
            return values[None]
        # Every replica holds this process's values; replicas are numbered process by process.
        per_replica = self._gather_replicas(tf.constant(values, tf.float32)).numpy()
        return per_replica[:: len(per_replica) // processes].astype(np.float64)

    def _replica_values(self, values: tf.Tensor) -> tf.Tensor:
        """[n] -> [replicas, n]: `values` as every replica of every process holds it."""
        return self.strategy.gather(self.strategy.run(lambda: tf.expand_dims(tf.identity(values), 0)), axis=0)

    def generate(self, state: TfState, prompts: Prompts) -> np.ndarray:
        return self._kind.generate(state.steps.model, prompts)

    def export(self, state: TfState, format: str, folder: Path, data) -> None:
        if format != "saved_model":
            super().export(state, format, folder, data)
        export.saved_model(state.steps.model, state.steps.keras_layer, state.steps.task, folder, data)

    def start_profile(self, logdir: Path) -> None:
        tf.profiler.experimental.start(str(logdir))

    def stop_profile(self) -> None:
        tf.profiler.experimental.stop()


@contextlib.contextmanager
def dtype_policy(name: str) -> Iterator[None]:
    """Keras' dtype policy while the model is built: "mixed_bfloat16" computes in bfloat16 with float32
    variables (batch-norm statistics, attention softmax and the loss stay float32)."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)

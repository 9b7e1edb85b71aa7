"""The contract between the core's Trainer and a framework backend.

The core owns the loop (data order, learning rate, evaluation, checkpoints); a backend owns the step. Everything
that crosses the boundary is numpy or plain Python, so no framework tensor ever enters the core.

A host batch (`Batch`) is a dict of numpy arrays with a static shape, B the global batch and L one of the
configured bucket lengths. It holds the model's inputs, which the task names (`Task.inputs`, `ModelSpec.inputs`):
a text task's are TEXT_INPUTS,

    input_ids       int32   [B, L]   token ids, 0-padded on the right
    token_type_ids  int32   [B, L]   segment ids (0 first sentence, 1 second)
    attention_mask  int32   [B, L]   1 for real tokens, 0 for padding

an image task's `images` uint8 [B, H, W, 3] (RGB pixels; each task module scales them on the device), a speech
task's `features` float32 [B, T, mel] (log-mel frames) with its `attention_mask` [B, T]. The task
(`tpuplex.tasks`) adds its TARGETS: `labels` and `weight`, whose shape is that of the task's loss units ([B] for
sequence classification, [B, L] per token for masked-LM pre-training). A unit of weight 0 (a padding row, an
unmasked token) counts for nothing. Any further entry is an input of the task's head (`head_inputs`). What an
input becomes on the device is one rule, `device_dtype`: floating arrays float32, uint8 as it is, other integers
the framework's index type.

Semantics every backend implements the same way:
- loss = sum(weight * unit_loss) / max(sum(weight), 1) over the global batch, `unit_loss` the task's (its backend
  module's `unit_losses`).
- the gradient of that loss on the global batch, averaged over replicas (each replica gets B / replicas rows);
  with `grad_accum = k` each replica's rows are split into k equal micro-batches whose gradients are averaged.
- clip by global norm: g *= min(1, clip_norm / global_norm(g)).
- AdamW (decoupled weight decay, bias-corrected moments):
      m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  t += 1
      p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)  +  lr * weight_decay * p   [decay only where decays(name)]
  or, with `OptimizerSpec.optimizer = "sgd"`, torch.optim.SGD's momentum (dampening 0):
      g += weight_decay * p   [only where decays(name)];  m = momentum m + g;  t += 1
      p -= lr * (g + momentum m if nesterov else m)
  whose buffer m is the portable state's `exp_avg` (`exp_avg_sq` stays zero).
- the learning rate of each step comes from the Trainer (see `tpuplex.engine.schedule`); backends never compute it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from tpuplex.errors import TpuplexError
from tpuplex.hardware import Topology
from tpuplex.slices import SliceReader

Batch = Mapping[str, np.ndarray]
TEXT_INPUTS: tuple[str, ...] = ("input_ids", "token_type_ids", "attention_mask")
TARGETS: tuple[str, ...] = ("labels", "weight")


def device_dtype(array: np.ndarray, index: Any) -> Any:
    """The dtype a backend gives an input array on its devices: float32 for floating arrays (log-mel features),
    uint8 as it is (pixels), and `index` (the framework's index type: int64 for torch, int32 for tf) for every
    other integer array (token ids, masks, positions)."""
    kind = np.asarray(array).dtype
    if kind.kind == "f":
        return np.float32
    return np.uint8 if kind == np.uint8 else index


def batch_rows(batch: Mapping[str, Any]) -> int:
    """B, the rows of `batch` (every entry's first dimension)."""
    return len(next(iter(batch.values())))


def head_inputs(batch: Mapping[str, Any], inputs: Sequence[str]) -> dict[str, Any]:
    """The batch's entries beyond the model's `inputs` and the TARGETS: integer arrays [B, ...] the task's head
    takes as keyword arguments (the masked LM's `masked_positions` [B, P]); every backend passes them through."""
    return {key: value for key, value in batch.items() if key not in (*inputs, *TARGETS)}


def decays(name: str) -> bool:
    """Whether AdamW applies weight decay to the parameter `name` (HF naming): not to biases, LayerNorms
    (`LayerNorm`, `layer_norm`, ViT's `layernorm_before`, GPT-2's `ln_1`, Llama's `norm`) nor batch norms (a
    ResNet's `normalization`)."""
    lowered = name.lower()
    module = name.rsplit(".", 2)[-2] if name.count(".") else ""
    return not (name.endswith(".bias") or "layernorm" in lowered or "layer_norm" in lowered
                or ".normalization." in name or module.startswith("ln_") or module == "norm")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The model to build, as the core resolved it.

    kind: the model kind (`tpuplex.kinds.ModelKind`); a backend builds the network with the kind's module of its
        framework (`tpuplex.kinds.<framework>.load(spec)`) and never asks which kind it is.
    task: the task (`tpuplex.tasks.Task`); `tpuplex.tasks.<framework>.load(task)` gives its head and loss in the
        backend's framework.
    inputs: the batch entries the model takes (`Task.inputs`: TEXT_INPUTS, or `images`).
    head: the task's head for this family (`tpuplex.tasks.Head`: HF names, shapes, settings).
    hf_config, family, arch: the checkpoint's `config.json`, its family (`tpuplex.models`) and architecture;
        empty and None for a model of your own.
    params: initial weights under the HF names of the family's encoder and `head`, in torch layout (Linear
        weights are [out, in]), float32; the head's missing parts drawn by the core, so every backend starts
        from the same numbers. Each a `tpuplex.slices.SliceReader` (a numpy array, or a drawn parameter made a
        block at a time when read: `tpuplex.initializers`), so a backend reads only the blocks its devices keep.
        A tied parameter (the MLM decoder) is not listed: it is the one it is tied to.
        Empty for a model of your own, which its framework initialises from the optimizer's seed.
    buffers: the initial non-trainable state under HF names (batch-norm running statistics, float32, and update
        counts, int64); empty for the text families.
    dropout: False turns every dropout off (used for parity runs); True uses the rates in `hf_config`.
    checkpoint_dir: where the weights came from, for backends that build from the directory (HF torch).
    architecture: a model of your own's import path (`tpuplex.models.user`), built as
        `factory(**model_arguments)` (`Task.model_arguments`: text tasks `vocab_size` and `num_labels`, images
        `num_labels` and `image_shape`).
    example_batch: two rows shaped as the task's batches (`Task.example_batch`), to build a model's variables.
    batch_norm: "cross_replica" (statistics over the global batch: R replicas train as one) or "per_replica"
        (each replica's own rows, the frameworks' default), for families with batch norm.
    frozen: names in `params` that keep their initial values: no gradient is computed for them and the optimizer
        holds no moments of them (`PortableState.exp_avg` lists only the others). A LoRA run's base.
    lora: the LoRA adapters the decoder builds (`tpuplex.models.lora.Lora`: where, rank, scale, dropout), their
        initial values among `params`; None without.
    base_sha256: with `frozen`, the fingerprint of the frozen parameters (`tpuplex.models.lora.fingerprint`), which
        checkpoints record in place of them.
    """

    kind: Any
    task: Any
    head: Any
    params: Mapping[str, SliceReader]
    inputs: tuple[str, ...] = TEXT_INPUTS
    hf_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    family: Any = None
    arch: Any = None
    buffers: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    dropout: bool = True
    checkpoint_dir: Path | None = None
    architecture: str = ""
    model_arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    example_batch: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    batch_norm: str = "cross_replica"
    frozen: frozenset[str] = frozenset()
    lora: Any = None
    base_sha256: str = ""

    @property
    def num_labels(self) -> int:
        """The classifier's outputs (tasks whose head has `num_labels`: user models are classifiers)."""
        return self.head.num_labels


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """Everything about the update rule a backend needs; the learning rate arrives per step instead."""

    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    clip_norm: float = 1.0
    grad_accum: int = 1
    bf16: bool = False
    fp8: bool = False
    seed: int = 0
    optimizer: str = "adamw"
    momentum: float = 0.9
    nesterov: bool = True


@dataclasses.dataclass
class PortableState:
    """A training state every backend can read: the portable checkpoint's content.

    params: HF names -> float32 arrays (same names and layout as `ModelSpec.params`).
    exp_avg, exp_avg_sq: Adam's first and second moments under the same names (zeros before the first step), of
        the trained parameters only (not `ModelSpec.frozen`).
    step: optimizer updates applied so far (Adam's bias-correction count).
    buffers: the model's non-trainable state (batch-norm moving statistics and counts), which the optimizer never
        touches, under the model's own names.

    A restored state's values are read a block at a time (`tpuplex.slices.SliceReader`: a checkpoint's
    `StoredArray`, `np.asarray` for the whole); `Backend.state_to_slices` gives, per name, the `tpuplex.slices.Slice`s
    this process writes.
    """

    params: dict[str, np.ndarray]
    exp_avg: dict[str, np.ndarray]
    exp_avg_sq: dict[str, np.ndarray]
    step: int
    buffers: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Prompts:
    """What a decoder generates from (`Backend.generate`), every array from the core.

    ids: int32 [B, P] prompts left-padded to a bucket length P; mask: int32 [B, P], 1 on the prompts' tokens.
    new_tokens: N, the tokens generated after each prompt (one compiled loop).
    temperature: 0 picks the most likely token (greedy); else logits / temperature are sampled.
    top_k: sample among the k most likely tokens only (0: all).
    uniforms: float32 [B, N] in [0, 1): each step's draw, turned into a token by the inverse of the sampled
        distribution's CDF over token ids (so one seed gives the same tokens on every backend).
    cache: keep each layer's keys and values (a key/value cache of P + N positions); False recomputes the whole
        sequence at every step (for comparison).
    beams: an encoder-decoder's beam search of this many beams when > 1 (`tpuplex.models.search.beam`), scored
        by summed log-probability / length ** length_penalty.
    """

    ids: np.ndarray
    mask: np.ndarray
    new_tokens: int
    temperature: float
    top_k: int
    uniforms: np.ndarray
    cache: bool = True
    beams: int = 1
    length_penalty: float = 1.0


@runtime_checkable
class Backend(Protocol):
    """What a framework backend implements. `State` is opaque to the core."""

    name: ClassVar[str]

    def topology(self) -> Topology:
        """Devices as the framework sees them; `device_count` is the number of data-parallel replicas."""

    def init(self, model: ModelSpec, optimizer: OptimizerSpec) -> Any:
        """Build the model from `model.params`, the optimizer with zero moments, and return the state."""

    def train_step(self, state: Any, batch: Batch, learning_rate: float) -> tuple[Any, float]:
        """One optimizer update on a global batch; returns the new state and the batch's mean loss."""

    def train_steps(
        self, state: Any, batches: Sequence[Batch], learning_rates: Sequence[float]
    ) -> tuple[Any, list[float]]:
        """Several updates in one call (steps_per_execution); batches share one shape. Returns each loss."""

    def predict(self, state: Any, batch: Batch) -> np.ndarray:
        """The task's predict outputs (`predict_outputs` of its framework module: logits [B, num_labels], or per
        token [B, L, ...]) for every row, padding rows included (the core applies the weights)."""

    def hold(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Place `arrays` on every device once, for the rest of the run (`TaskData.held`: an image run's training
        images); every later train step's task module reads them beside its batch's entries, under the same
        names. Raises TpuplexError where the backend holds nothing (`holds_data` false)."""

    def state_to_arrays(self, state: Any) -> PortableState:
        """Parameters and Adam moments as numpy arrays under HF names."""

    def state_to_slices(self, state: Any) -> PortableState:
        """What this process writes of the state to a checkpoint: per name, the `tpuplex.slices.Slice`s its devices
        hold, each slice of the whole state held by exactly one process (a replicated array: one). Every process
        calls it at the same point."""

    def state_from_arrays(self, state: Any, arrays: PortableState) -> Any:
        """A state equal to `arrays` (each a `tpuplex.slices.SliceReader`: read only the blocks this process's
        devices hold); raises TpuplexError naming missing/unexpected/mis-shaped parameters. `state` is spent, as a
        donated buffer is: a backend may write the restored values into it or free it first (so a restore never
        holds two states); use the one returned."""

    def compile_count(self) -> int:
        """Programs the framework has compiled (or traced) so far, for the recompilation guard."""

    def forward_flops(self, state: Any, batch: Batch) -> float | None:
        """FLOPs of the model's inference forward on the global `batch`, as the framework counts them (a compiled
        program's cost analysis, a FLOP counter), for a model `tpuplex.flops` does not count (your own); None
        where the framework gives no count. Called once per batch shape; it must not count as a compilation."""

    def host_allgather(self, values: np.ndarray) -> np.ndarray:
        """float64 [n] from every process -> float64 [processes, n] in process order, on every process. The core
        sends only integers below 2^16, exact even where a framework's collective runs in float32.

        Collective: every process calls it at the same point. The core's only cross-process primitive
        (`tpuplex.hosts`): agreement checks, the preemption flag, the barrier after a checkpoint.
        """

    def start_profile(self, logdir: Path) -> None:
        """Start the framework's profiler trace into `logdir`."""

    def stop_profile(self) -> None:
        """Stop the trace started by `start_profile`."""


class BackendBase:
    """Defaults a backend may inherit: `train_steps` as a loop over `train_step`, no profiler, and
    `host_allgather` for a single process.

    shards_parameters: whether the backend lays parameters out by `tpuplex.sharding` (a mesh with fsdp or tensor
    above 1); the others keep every parameter whole on each device and take a data-only mesh.
    """

    shards_parameters: ClassVar[bool] = False

    def state_bytes(self, state: Any) -> int | None:
        """Bytes of parameters and optimizer moments held by the device that holds the most (None: not known)."""
        return None

    def state_to_slices(self, state: Any) -> PortableState:
        """A backend that holds the state whole everywhere: its whole arrays, which `checkpoint.save` has process 0
        write."""
        return self.state_to_arrays(state)

    holds_data: ClassVar[bool] = False
    """Whether `hold` places data on the devices (a run that asks for it is refused before it starts otherwise)."""

    def hold(self, arrays: Mapping[str, np.ndarray]) -> None:
        raise TpuplexError(f"the {getattr(self, 'name', 'this')} backend keeps no data on its devices "
                           f"({', '.join(arrays)})")

    def train_steps(self, state, batches, learning_rates):
        losses = []
        for batch, learning_rate in zip(batches, learning_rates, strict=True):
            state, loss = self.train_step(state, batch, learning_rate)
            losses.append(loss)
        return state, losses

    def start_profile(self, logdir: Path) -> None:
        return None

    def stop_profile(self) -> None:
        return None

    def forward_flops(self, state: Any, batch: Batch) -> float | None:
        return None

    def generate(self, state: Any, prompts: Prompts) -> np.ndarray:
        """int32 [B, N]: the tokens a decoder (`tpuplex.kinds.decoder`) generates after each prompt."""
        raise TpuplexError(f"the {self.name} backend cannot generate text")

    def export(self, state: Any, format: str, folder: Path, data: Any) -> None:
        """Write `state` in the framework's own serving `format` into the empty `folder` (`tpuplex.commands.export`);
        `data` (the run's `TaskData`) says what serving needs to know of the data: classes, image size."""
        raise TpuplexError(f"the {self.name} backend cannot export {format!r}")

    def host_allgather(self, values: np.ndarray) -> np.ndarray:
        processes = self.topology().host_count
        if processes != 1:
            raise NotImplementedError(f"backend {self.name} runs {processes} processes but has no host_allgather")
        return np.asarray(values, np.float64)[None]

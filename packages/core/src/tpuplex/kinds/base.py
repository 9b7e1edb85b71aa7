"""The base of every model kind (`ModelKind`) and what the kinds share: LoRA adapters beside a spec's parameters,
the import paths of a kind's framework modules in the backend packages, and their construction.

Each kind (`tpuplex/kinds/<kind>/`) subclasses `ModelKind` from here; `tpuplex.kinds` assembles them and resolves
`[model]` to one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex.errors import ConfigError
from tpuplex.models.lora import Lora, fingerprint
from tpuplex.nn import Network
from tpuplex.plugins import construct
from tpuplex.protocol import ModelSpec
from tpuplex.slices import SliceReader


class ModelKind:
    """A kind of model as one run resolved it (subclasses set `name`, `frameworks` and what they answer to).

    checkpoint_dir: where the weights (and a text task's tokenizer) come from; None when nothing is read.
    hf_config, family, arch: the checkpoint's config.json, its family and architecture (empty / None for a model
        of your own).
    """

    name: ClassVar[str]
    frameworks: ClassVar[Mapping[str, str]]
    """Backend name -> import path ("package.module:Class") of the kind's `KindModule` in that framework."""
    families: ClassVar[tuple[Any, ...]] = ()
    """The families (`tpuplex.models`) whose checkpoints are this kind."""

    def __init__(self, checkpoint_dir: Path | None, hf_config: Mapping[str, Any], family: Any, arch: Any):
        self.checkpoint_dir, self.hf_config, self.family, self.arch = checkpoint_dir, hf_config, family, arch

    def check(self, config: Any, task: Any) -> None:
        """Cheap checks of the config against the model, before the data is read."""

    def check_data(self, data: Any) -> None:
        """Checks of the task's encoded data against the model (token ids within the vocabulary)."""

    def initial_state(self, head: Any, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The parameters and non-trainable state every backend starts from (HF names, torch layout)."""
        raise NotImplementedError

    def model_arguments(self, config: Any, task: Any, data: Any, head: Any) -> dict[str, Any]:
        """What a model of your own is built with (`Task.model_arguments`); nothing for a family."""
        return {}

    def hf_class(self, config: Any, task: Any) -> str:
        """transformers' class of the trained model (`tpuplex export --format hf`'s "architectures")."""
        return task.hf_class(self.family, self.hf_config["model_type"])

    def hf_weights(self, weights: dict[str, SliceReader]) -> dict[str, SliceReader]:
        """A checkpoint's parameters (HF names) as the HF export writes them: as they are, unless the kind's HF
        class needs more (a bias-free GPT-2's zero biases)."""
        return weights

    def tensor_dims(self) -> dict[str, int]:
        """Portable name -> the dimension of the weight its tensor-parallel role splits (`tpuplex.sharding`): the
        text encoders' and decoders' families say; other kinds split nothing over `tensor`."""
        return {}

    def forward_flops(self, spec: ModelSpec, batch: Mapping[str, np.ndarray]) -> float | None:
        """Forward FLOPs of the kind's network on `batch` (`tpuplex.flops`: the task's head is the task's to
        count), a function of the batch's shapes alone; None where they are not counted (a model of your own)."""
        return None

    def network(self, spec: ModelSpec) -> Network:
        """The network written once that each backend's generic holder (`tpuplex_<backend>.kinds.network`) runs, for
        a kind whose `frameworks` name that holder."""
        raise NotImplementedError(f"the {self.name} kind's network is held by its own backend modules")

    def lora(self, config: Any) -> Lora | None:
        """The LoRA adapters `[model.lora]` asks for (`tpuplex.models.lora`); kinds other than decoders refuse."""
        if config.model.lora:
            raise ConfigError(f"model.lora adapts decoder models, not a {self.name} model: remove [model.lora], or "
                              "give model.checkpoint a decoder model (the causal_lm task)")
        return None

    def spec(self, config: Any, task: Any, data: Any) -> ModelSpec:
        """The model to build for `task` on `data`: the head, the initial state, and what the backends need. With
        LoRA, the initial state is the base, frozen, and the adapters drawn beside it."""
        head = task.head(self.family, self.arch, self.hf_config, data)
        lora = self.lora(config)
        initial, buffers = self.initial_state(head, config.train.seed)
        spec = ModelSpec(kind=self, task=task, inputs=task.inputs, head=head, hf_config=self.hf_config,
                         family=self.family, arch=self.arch, params=initial, buffers=buffers,
                         dropout=config.model.dropout, checkpoint_dir=self.checkpoint_dir,
                         architecture=config.model.architecture, batch_norm=config.model.batch_norm,
                         model_arguments=self.model_arguments(config, task, data, head),
                         example_batch=task.example_batch(data))
        return spec if lora is None else with_adapters(spec, lora, config.train.seed)


def with_adapters(spec: ModelSpec, lora: Lora, seed: int) -> ModelSpec:
    """`spec` with LoRA adapters drawn from `seed` beside its parameters, which become the frozen base."""
    return dataclasses.replace(spec, params={**spec.params, **lora.initial(spec.arch, seed)},
                               frozen=frozenset(spec.params), lora=lora, base_sha256=fingerprint(spec.params))


def backend_modules(kind: str, name: str) -> dict[str, str]:
    """`ModelKind.frameworks` of a kind whose framework modules each backend package holds:
    `tpuplex_<backend>.kinds.<kind>:<name>`."""
    return {framework: f"tpuplex_{framework}.kinds.{kind}:{name}" for framework in ("jax", "tf", "torch")}


def framework_module(spec: ModelSpec, framework: str, contract: type) -> Any:
    """The `KindModule` of `framework` (a subclass of `contract`, in `tpuplex_<framework>.kinds`) of the kind
    `spec` was resolved to, imported and constructed now."""
    return construct(spec.kind.frameworks[framework], f"the {spec.kind.name} model's {framework} module", contract)

"""The contract of a model kind's PyTorch module: `build`, which the torch backend calls for every kind.

The backend moves `Built.module` to its device, restores `Built.params` and `Built.buffers` into it (with zero
optimizer moments) and calls `Built.forward` in its steps.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import transformers  # a lazy module: the model classes (and accelerate behind them) load on first use

import torch
from tpuplex import kinds
from tpuplex.errors import TpuplexError
from tpuplex.params import check_names
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts

Forward = Callable[[torch.nn.Module, Mapping[str, torch.Tensor]], torch.Tensor]
"""(model, batch tensors) -> the outputs the task's `unit_losses` and `predict_outputs` take."""


@dataclasses.dataclass(frozen=True)
class Built:
    """A model on the CPU in float32, how to call it, its initial parameters and its non-trainable state (numpy,
    by name: batch-norm statistics; none for the text families)."""

    module: torch.nn.Module
    forward: Forward
    params: Mapping[str, np.ndarray]
    buffers: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)


class KindModule(abc.ABC):
    @abc.abstractmethod
    def build(self, spec: ModelSpec, task: Any, optimizer: OptimizerSpec) -> Built:
        """The model of `spec` with the task's parts (`tpuplex.tasks.torch.TaskModule`), every dropout off unless
        `spec.dropout`."""

    def generate(self, model: torch.nn.Module, prompts: Prompts) -> np.ndarray:
        """int32 [B, N]: the tokens the built model generates after each prompt (`tpuplex.protocol.Prompts`)."""
        raise TpuplexError(f"a {type(self).__name__} model generates no text: tpuplex generate needs a decoder "
                           "(model.checkpoint a GPT-2 or Llama model) trained on the causal_lm task")


def hf_model(spec: ModelSpec, head_config: Mapping[str, Any]) -> torch.nn.Module:
    """transformers' model for the task (`spec.task.auto_class`) from the checkpoint's config.json and the task's
    `head_config`, float32; every dropout rate 0 unless `spec.dropout`."""
    settings = dict(spec.hf_config)
    config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings, **head_config)
    if not spec.dropout:
        for key, value in config.to_dict().items():
            # hidden_dropout_prob, classifier_dropout (None: falls back to hidden), ...
            if "dropout" in key and (value is None or isinstance(value, float)):
                setattr(config, key, 0.0)
    return getattr(transformers, spec.task.auto_class).from_config(config, dtype=torch.float32)


def load_parameters(model: torch.nn.Module, params: Mapping[str, np.ndarray], tied: Mapping[str, str]) -> None:
    """Load `params` (HF names, torch layout) into `model` strictly; mismatched names or shapes raise one
    TpuplexError naming them. A tied parameter appears once in `params` (and in named_parameters) but under both
    names in the state dict: `tied` maps each alias to the parameter it is."""
    expected = {name: tuple(parameter.shape) for name, parameter in model.named_parameters()}
    check_names(expected, params, "the initial parameters")
    state = {name: torch.from_numpy(np.asarray(array, dtype=np.float32)) for name, array in params.items()}
    model.load_state_dict(state | {alias: state[target] for alias, target in tied.items()}, strict=True)


def load(spec: ModelSpec) -> KindModule:
    return kinds.framework_module(spec, "torch", KindModule)

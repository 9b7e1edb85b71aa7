"""The contract of a model kind's PyTorch module: `build`, which the torch backend calls for every kind.

The backend moves `Built.module` to its device (FSDP2: this process's shards of it), restores `Built.params` and
`Built.buffers` into it (with zero optimizer moments) and calls `Built.forward` in its steps. A kind builds the
module's structure only: its parameters' values are the backend's to set, and under FSDP2 the backend builds it
with parameters on the meta device (`tpuplex_torch.devices.Placement.building`), so no process ever makes them
whole.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import torch
from tpuplex import kinds
from tpuplex.errors import TpuplexError
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts
from tpuplex.slices import SliceReader

Forward = Callable[[torch.nn.Module, Mapping[str, torch.Tensor]], torch.Tensor]
"""(model, batch tensors) -> the outputs the task's `unit_losses` and `predict_outputs` take."""


@dataclasses.dataclass(frozen=True)
class Built:
    """A model in float32, how to call it, its initial parameters (`tpuplex.slices.SliceReader`s by HF name) and its
    non-trainable state (numpy, by name: batch-norm statistics; none for the text families)."""

    module: torch.nn.Module
    forward: Forward
    params: Mapping[str, SliceReader]
    buffers: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)


class KindModule(abc.ABC):
    @abc.abstractmethod
    def build(self, spec: ModelSpec, task: Any, optimizer: OptimizerSpec) -> Built:
        """The model of `spec` with the task's parts (`tpuplex_torch.tasks.TaskModule`), every dropout off unless
        `spec.dropout`."""

    def generate(self, model: torch.nn.Module, prompts: Prompts) -> np.ndarray:
        """int32 [B, N]: the tokens the built model generates after each prompt (`tpuplex.protocol.Prompts`)."""
        raise TpuplexError(f"a {type(self).__name__} model generates no text: tpuplex generate needs a decoder "
                           "(model.checkpoint a GPT-2 or Llama model) trained on the causal_lm task")


def load(spec: ModelSpec) -> KindModule:
    return kinds.framework_module(spec, "torch", KindModule)

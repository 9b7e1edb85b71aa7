"""The contract of a model kind's Flax (JAX) module: `build`, which the jax backend calls for every kind.

The backend runs the model on the global batch, laid out over its device mesh by `tpuplex.sharding` (GSPMD), and
keeps the trees `Built` gives under the portable names its namings spell.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import flax.linen as nn
import numpy as np

from tpuplex import kinds
from tpuplex.errors import TpuplexError
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts
from tpuplex_jax.ops import Naming


@dataclasses.dataclass(frozen=True)
class Built:
    """A Flax network and its initial trees.

    params: the parameter tree; model_state: the other collections (`{"batch_stats": ...}`; empty for most); their
    leaves numpy arrays or `tpuplex.slices.SliceReader`s (the core's views, which the backend reads a device's block
    at a time, so a sharded parameter is never whole on a host);
    naming, state_naming: how their paths become portable names; max_length: the longest sequence it takes (its
    position embeddings), int32's max when it has no such limit.
    """

    network: nn.Module
    params: Any
    model_state: dict
    naming: Naming
    state_naming: Naming
    max_length: int


class KindModule(abc.ABC):
    @abc.abstractmethod
    def build(self, spec: ModelSpec, task: Any, optimizer: OptimizerSpec, batch_shards: int) -> Built:
        """The network of `spec` with the task's parts (`tpuplex_jax.tasks.TaskModule`), computing in bfloat16
        when `optimizer.bf16` (parameters stay float32); `batch_shards`: the parts the global batch is split into
        (what per-replica batch norm takes its statistics over)."""

    def generate(self, network: nn.Module, params: Any, prompts: Prompts) -> np.ndarray:
        """int32 [B, N]: the tokens the built network generates after each prompt (`tpuplex.protocol.Prompts`)."""
        raise TpuplexError(f"a {type(self).__name__} model generates no text: tpuplex generate needs a decoder "
                           "(model.checkpoint a GPT-2 or Llama model) trained on the causal_lm task")


def load(spec: ModelSpec) -> KindModule:
    return kinds.framework_module(spec, "jax", KindModule)

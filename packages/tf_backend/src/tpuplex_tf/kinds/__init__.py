"""The contract of a model kind's Keras (TensorFlow) module: `build`, which the tf backend calls for every kind.

The backend calls it under its strategy's scope and the run's dtype policy, then assigns `Built.params` and
`Built.buffers` to the model's variables and compiles its steps around `Built.model`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

import keras
import numpy as np
import tensorflow as tf

from tpuplex import kinds
from tpuplex.errors import TpuplexError
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts


class Network(Protocol):
    """A Keras network as the tf backend's steps drive it: `network(*inputs, seed=None, **head_inputs)` (a seed,
    int32 [2], in training: dropout on, batch norm on the batch's statistics; None in inference)."""

    def __call__(self, *inputs: tf.Tensor, seed: tf.Tensor | None = None, **head_inputs: tf.Tensor) -> tf.Tensor:
        """The outputs the task's `unit_losses` and `predict_outputs` take."""

    def hf_variables(self) -> dict[str, tuple[keras.Variable, bool]]:
        """Portable name -> (trainable variable, whether it is a kernel in Keras' layout)."""

    def state_variables(self) -> dict[str, keras.Variable]:
        """Portable name -> non-trainable state that training updates (batch-norm statistics)."""


@dataclasses.dataclass(frozen=True)
class Built:
    """A network with every variable created, and the values its variables start from (portable names and
    layout: `tpuplex.protocol.PortableState`)."""

    network: Network
    params: Mapping[str, np.ndarray]
    buffers: Mapping[str, np.ndarray]
    synchronises_replicas: bool = False
    """Whether its forward pass all-reduces across replicas itself (cross-replica batch norm)."""
    wrapped: keras.layers.Layer | None = None
    """The Keras module the network wraps (a model of your own), which a SavedModel tracks; None: the network is
    a Keras model itself."""

    @property
    def keras_layer(self) -> keras.layers.Layer:
        """What `keras.export.ExportArchive` tracks for this network."""
        return self.network if self.wrapped is None else self.wrapped


class KindModule(abc.ABC):
    @abc.abstractmethod
    def build(self, spec: ModelSpec, task: Any, optimizer: OptimizerSpec) -> Built:
        """The network of `spec` with the task's parts (`tpuplex_tf.tasks.TaskModule`), every dropout rate 0
        unless `spec.dropout`."""

    def generate(self, network: Network, prompts: Prompts) -> np.ndarray:
        """int32 [B, N]: the tokens the built network generates after each prompt (`tpuplex.protocol.Prompts`)."""
        raise TpuplexError(f"a {type(self).__name__} model generates no text: tpuplex generate needs a decoder "
                           "(model.checkpoint a GPT-2 or Llama model) trained on the causal_lm task")


def load(spec: ModelSpec) -> KindModule:
    return kinds.framework_module(spec, "tf", KindModule)

"""Your own network (`model.architecture`, `tpuplex.models.user`), built from the task's `model_arguments`.

Written once (a `tpuplex.nn.Network`, `OwnNetwork`): its parameters drawn by the core from `train.seed`, held by each
backend's generic holder (`tpuplex_<backend>.kinds.network`) under the names it declares, so its checkpoints are
portable. Written in one framework (`OwnModel`: a `torch.nn.Module`, a Flax module, a Keras model, the path's
`{backend}` naming each): built by each framework's module here and initialised by that framework.

A text task still reads model.checkpoint, for its tokenizer (and the vocabulary size the model is built with);
an image task reads nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from tpuplex import checkpoints
from tpuplex.data.tokenize import load_tokenizer
from tpuplex.errors import TpuplexError
from tpuplex.kinds.base import ModelKind, backend_modules
from tpuplex.models import user
from tpuplex.nn import Network, Param, initial_params
from tpuplex.protocol import ModelSpec


class OwnModel(ModelKind):
    name: ClassVar[str] = "own"
    frameworks: ClassVar[dict[str, str]] = backend_modules("own", "OwnModel")

    @classmethod
    def resolve(cls, config: Any, task: Any) -> OwnModel:
        """A network written once (`OwnNetwork`) when the path names a `tpuplex.nn.Network` (one path for every
        backend), else a framework's model."""
        checkpoint_dir = checkpoints.resolve_checkpoint(config.model.checkpoint) if task.tokenized else None
        architecture = config.model.architecture
        if "{backend}" not in architecture and _names_a_network(architecture):
            return OwnNetwork(checkpoint_dir, {}, None, None)
        return cls(checkpoint_dir, {}, None, None)

    def initial_state(self, head: Any, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """None from the core: the backend's framework initialises the model (`train.seed`)."""
        return {}, {}

    def hf_class(self, config: Any, task: Any) -> str:
        raise TpuplexError(f"the run trained your own model ({config.model.architecture}), whose parameters keep "
                           "their framework's names: export hf needs a model family checkpoint (model.checkpoint)")

    def model_arguments(self, config: Any, task: Any, data: Any, head: Any) -> dict[str, Any]:
        """The task's; a text task's model gets the tokenizer's vocabulary size (its embedding table)."""
        vocab_size = (load_tokenizer(self.checkpoint_dir, config.data.max_length).get_vocab_size()
                      if self.checkpoint_dir else 0)
        return task.model_arguments(data, head, vocab_size)


class OwnNetwork(OwnModel):
    """A network written once over the op table (`tpuplex.nn.Network`): the core draws its parameters, each
    backend's generic holder runs it."""

    frameworks: ClassVar[dict[str, str]] = backend_modules("network", "NetworkModule")

    def spec(self, config: Any, task: Any, data: Any) -> ModelSpec:
        """The task's spec with the parameters `params()` declares, drawn from `train.seed` a block at a time."""
        spec = super().spec(config, task, data)
        return dataclasses.replace(spec, params=initial_params(self.network(spec), config.train.seed))

    def network(self, spec: ModelSpec) -> Network:
        """Your network, its output checked to be logits [rows, num_labels] wherever its shapes are known."""
        network = user.build(spec.architecture, "", spec.model_arguments, Network, "tpuplex.nn.Network")
        return CheckedLogits(network, spec.architecture, spec.num_labels)

    def hf_class(self, config: Any, task: Any) -> str:
        raise TpuplexError(f"the run trained your own network ({config.model.architecture}), which transformers "
                           "has no class for: export it with --format saved_model (from a run of any backend), or "
                           "read its parameters from the run's portable checkpoint")


class CheckedLogits(Network):
    """A network of your own whose output is checked to be logits [rows, num_labels] wherever the shapes are
    static (eager torch, jax's traces, TensorFlow's first call); nothing else constrains it."""

    def __init__(self, network: Network, architecture: str, num_labels: int):
        self.network, self.architecture, self.num_labels = network, architecture, num_labels

    def params(self) -> Mapping[str, Param]:
        return self.network.params()

    def __call__(self, ops: Any, params: Mapping[str, Any], *inputs: Any) -> Any:
        logits = self.network(ops, params, *inputs)
        rows = ops.shape(inputs[0])[0]
        if isinstance(rows, int):
            shape = tuple(ops.shape(logits)) if hasattr(logits, "shape") else type(logits).__name__
            user.check_logits(self.architecture, shape, rows, self.num_labels)
        return logits


def _names_a_network(architecture: str) -> bool:
    """Whether `architecture` imports as a `tpuplex.nn.Network` subclass. One that does not import yet is taken for
    a framework's model, whose backend names the failure when it builds it (after the data's own checks)."""
    try:
        found = user.resolve(architecture, "")
    except TpuplexError:
        return False
    return isinstance(found, type) and issubclass(found, Network)

"""The generic holder of a network written once (`tpuplex.nn.Network`) in PyTorch: its parameters registered under
the names it declares, its forward pass run over `TorchOps`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import torch
from tpuplex.models import user
from tpuplex.nn import Network
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_torch.kinds import Built, KindModule
from tpuplex_torch.ops import TorchOps, read_slots, register_parameters


class NetworkHolder(torch.nn.Module):
    """`network`'s parameters as a module's (`named_parameters()` gives its names); dropout drawn in training when
    `dropout`."""

    def __init__(self, network: Network, shapes: Mapping[str, tuple[int, ...]], dropout: bool):
        super().__init__()
        self.network, self.dropout = network, dropout
        self.slots = register_parameters(self, shapes)

    def forward(self, *inputs: torch.Tensor) -> Any:
        ops = TorchOps(self.training and self.dropout, inputs[0].device)
        return self.network(ops, read_slots(self.slots), *inputs)


class NetworkModule(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        network = user.build(spec.architecture, "", spec.model_arguments, Network, "tpuplex.nn.Network")
        shapes = {name: tuple(np.shape(array)) for name, array in spec.params.items()}
        architecture, num_labels = spec.architecture, spec.num_labels

        def forward(model: NetworkHolder, batch: Mapping[str, torch.Tensor]) -> Any:
            arguments = task.model_inputs(batch)
            logits = model(*arguments)
            user.check_logits(architecture, tuple(logits.shape), arguments[0].shape[0], num_labels)
            return logits

        return Built(NetworkHolder(network, shapes, spec.dropout), forward, spec.params)

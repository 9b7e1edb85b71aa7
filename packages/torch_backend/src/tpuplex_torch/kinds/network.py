"""The generic holder of a network written once (`tpuplex.nn.Network`: a network of your own, the Conformer) in
PyTorch: its parameters registered under their portable names, its forward pass run over `TorchOps`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import torch
from tpuplex.nn import Network
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_torch.kinds import Built, KindModule
from tpuplex_torch.ops import TorchOps, read_slots, register_parameters


class NetworkHolder(torch.nn.Module):
    """`network`'s parameters as a module's (`named_parameters()` gives their names); dropout drawn in training when
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
        shapes = {name: tuple(np.shape(array)) for name, array in spec.params.items()}

        def forward(model: NetworkHolder, batch: Mapping[str, torch.Tensor]) -> Any:
            return model(*task.model_inputs(batch))

        return Built(NetworkHolder(spec.kind.network(spec), shapes, spec.dropout), forward, spec.params)

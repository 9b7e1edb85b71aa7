"""The speech families in PyTorch: the parameters under their names, run by the forward pass written once
(`tpuplex.models.conformer.forward`) over torch's table of operations (`tpuplex_torch.ops.TorchOps`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import torch
from tpuplex.models.conformer import ConformerArch, forward
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_torch.kinds import Built, KindModule
from tpuplex_torch.ops import TorchOps, read_slots, register_parameters


class SpeechModel(torch.nn.Module):
    """(features float32 [B, T, mel], attention_mask [B, T]) -> (logits [B, T', vocab], output_lengths [B])."""

    def __init__(self, arch: ConformerArch, shapes: Mapping[str, tuple[int, ...]]):
        super().__init__()
        self.arch = arch
        self.slots = register_parameters(self, shapes)

    def forward(self, features: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = attention_mask.sum(dim=1)
        logits = forward(TorchOps(self.training, features.device), read_slots(self.slots), self.arch, features, lengths)
        return logits, self.arch.output_frames(lengths)


def call(model: SpeechModel, batch: Mapping[str, torch.Tensor]) -> Any:
    return model(batch["features"], batch["attention_mask"])


class SpeechFamily(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        shapes = {name: tuple(np.shape(array)) for name, array in spec.params.items()}
        return Built(SpeechModel(arch, shapes), call, spec.params)

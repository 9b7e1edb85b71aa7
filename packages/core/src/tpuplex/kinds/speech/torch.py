"""The speech families in PyTorch: the parameters under their names, and the operations the forward pass
(`tpuplex.models.conformer.forward`) is written over."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch.nn.functional as F

import torch
from tpuplex.kinds.torch import Built, KindModule
from tpuplex.layers.torch import register_parameters
from tpuplex.models.conformer import SERVED_FRAMES, ConformerArch, forward, positions
from tpuplex.protocol import ModelSpec, OptimizerSpec


class TorchOps:
    """`tpuplex.models.conformer.Ops` in torch; dropout from torch's generator when `training`."""

    def __init__(self, training: bool, device: torch.device):
        self.training, self.device = training, device

    linear = staticmethod(F.linear)
    relu = staticmethod(F.relu)
    silu = staticmethod(F.silu)
    sigmoid = staticmethod(torch.sigmoid)
    where = staticmethod(torch.where)
    einsum = staticmethod(torch.einsum)

    def conv2d(self, x, weight, bias, stride):
        return F.conv2d(x, weight, bias, stride=stride)

    def depthwise_conv1d(self, x, weight, bias):
        return F.conv1d(x.transpose(1, 2), weight, bias, padding=weight.shape[-1] // 2,
                        groups=weight.shape[0]).transpose(1, 2)

    def layer_norm(self, x, weight, bias, eps):
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)

    def softmax(self, x):
        return torch.softmax(x, dim=-1)

    def reshape(self, x, shape):
        return x.reshape(shape)

    def transpose(self, x, axes):
        return x.permute(axes)

    def shape(self, x):
        return tuple(x.shape)

    def constant(self, array: np.ndarray):
        return torch.from_numpy(array).to(self.device)

    def positions(self, frames, width):
        if isinstance(frames, int):
            return self.constant(positions(frames, width))
        # torch.export traces `frames` as a symbol: a table of the most frames a program takes, cut to them.
        return self.constant(positions(SERVED_FRAMES, width))[:frames]

    def dropout(self, x, rate, site):
        return F.dropout(x, rate, self.training)

    def frame_mask(self, lengths, frames):
        return (torch.arange(frames, device=lengths.device)[None, :] < lengths[:, None]).float()


class SpeechModel(torch.nn.Module):
    """(features float32 [B, T, mel], attention_mask [B, T]) -> (logits [B, T', vocab], output_lengths [B])."""

    def __init__(self, arch: ConformerArch, shapes: Mapping[str, tuple[int, ...]]):
        super().__init__()
        self.arch = arch
        self.slots = register_parameters(self, shapes)

    def forward(self, features: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = attention_mask.sum(dim=1)
        params = {name: getattr(owner, leaf) for name, (owner, leaf) in self.slots.items()}
        logits = forward(TorchOps(self.training, features.device), params, self.arch, features, lengths)
        return logits, self.arch.output_frames(lengths)


def call(model: SpeechModel, batch: Mapping[str, torch.Tensor]) -> Any:
    return model(batch["features"], batch["attention_mask"])


class SpeechFamily(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        shapes = {name: tuple(np.shape(array)) for name, array in spec.params.items()}
        return Built(SpeechModel(arch, shapes), call, spec.params)

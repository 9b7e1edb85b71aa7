"""Image classification in PyTorch: the model is your own `torch.nn.Module`; this module says what it is called
with and what the loss of each image is."""

from __future__ import annotations

from collections.abc import Mapping

import torch.nn.functional as F

import torch


def model_inputs(batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor]:
    """images uint8 [b, H, W, 3] -> float32 [b, 3, H, W] in [0, 1]: torch's channels-first layout, scaled on the
    device."""
    return (batch["images"].permute(0, 3, 1, 2).float() / 255.0,)


def unit_losses(outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy per image [b] in float32, from logits [b, classes]."""
    return F.cross_entropy(outputs.float(), batch["labels"], reduction="none")


def predict_outputs(outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Logits float32 [b, classes]."""
    return outputs.float()

"""Token classification in PyTorch: the loss of each token (the head is `TokenClassifierHead.forward`, written
once)."""

from __future__ import annotations

from collections.abc import Mapping

import torch.nn.functional as F

import torch
from tpuplex_torch import tasks as tasks_torch


class Module(tasks_torch.TaskModule):
    def unit_losses(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-token cross-entropy [b, L] in float32 of logits [b, L, T] against the tag ids."""
        rows, length, tags = outputs.shape
        losses = F.cross_entropy(outputs.float().reshape(-1, tags), batch["labels"].reshape(-1), reduction="none")
        return losses.view(rows, length)

    def predict_outputs(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logits float32 [b, L, T]."""
        return outputs.float()

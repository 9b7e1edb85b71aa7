"""Causal-LM training in PyTorch: the next-token cross-entropy of a decoder's logits (`tpuplex.kinds.decoder`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch.nn.functional as F

import torch
from tpuplex.tasks import torch as tasks_torch


class Module(tasks_torch.TaskModule):
    def unit_losses(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-token cross-entropy [b, L] in float32 of logits [b, L, V] against the next tokens."""
        rows, length, vocab = outputs.shape
        losses = F.cross_entropy(outputs.float().reshape(-1, vocab), batch["labels"].reshape(-1), reduction="none")
        return losses.view(rows, length)

    def predict_outputs(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """float32 [b, L, 2]: each position's cross-entropy and 1.0 where the most likely token is the next one."""
        correct = (outputs.argmax(dim=-1) == batch["labels"]).float()
        return torch.stack([self.unit_losses(outputs, batch), correct], dim=-1)

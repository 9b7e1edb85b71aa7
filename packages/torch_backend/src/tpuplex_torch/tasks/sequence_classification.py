"""Sequence classification in PyTorch: the loss of each example (the head is `ClassifierHead.forward`, written
once)."""

from __future__ import annotations

from collections.abc import Mapping

import torch.nn.functional as F

import torch
from tpuplex_torch import tasks as tasks_torch


class Module(tasks_torch.TaskModule):
    def unit_losses(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Loss per row [b] in float32: cross-entropy for class labels, squared error for float (regression)
        labels against logits [b, 1]."""
        logits, labels = outputs.float(), batch["labels"]
        if labels.is_floating_point():
            return (logits[:, 0] - labels) ** 2
        return F.cross_entropy(logits, labels, reduction="none")

    def predict_outputs(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logits float32 [b, num_labels]."""
        return outputs.float()

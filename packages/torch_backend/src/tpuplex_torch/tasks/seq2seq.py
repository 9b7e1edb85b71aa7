"""Text-to-text training in PyTorch: the cross-entropy of an encoder-decoder's logits over the target tokens."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tpuplex_torch import tasks as tasks_torch


class Module(tasks_torch.TaskModule):
    def unit_losses(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-target-token cross-entropy [b, T] in float32 of logits [b, T, V]."""
        return tasks_torch.token_losses(outputs, batch["labels"])

    def predict_outputs(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """float32 [b, T, 2]: each target token's cross-entropy and 1.0 where it is the most likely token."""
        return tasks_torch.token_outputs(outputs, batch["labels"])

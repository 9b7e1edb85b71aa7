"""Causal-LM training in PyTorch: the next-token cross-entropy of a decoder's logits (`tpuplex.kinds.decoder`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tpuplex_torch import tasks as tasks_torch


class Module(tasks_torch.TaskModule):
    def unit_losses(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-token cross-entropy float32 [b, L] of logits [b, L, V] against the next tokens (a chat batch: [b, K],
        its answer targets')."""
        return tasks_torch.token_losses(outputs, batch["labels"])

    def predict_outputs(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """float32 [b, L, 2]: each position's cross-entropy and 1.0 where the most likely token is the next one."""
        return tasks_torch.token_outputs(outputs, batch["labels"])

"""Masked-LM pre-training in PyTorch: the cross-entropy of the masked positions (the head is
`MaskedLMHead.forward`, written once: the decoder tied to the word embeddings, on the masked positions only)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tpuplex_torch import tasks as tasks_torch


class Module(tasks_torch.TaskModule):
    def unit_losses(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-position cross-entropy [b, P] in float32 of logits [b, P, V] against the original ids."""
        return tasks_torch.token_losses(outputs, batch["labels"])

    def predict_outputs(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """float32 [b, P, 2]: each position's cross-entropy and 1.0 where the most likely token is the label."""
        return tasks_torch.token_outputs(outputs, batch["labels"])

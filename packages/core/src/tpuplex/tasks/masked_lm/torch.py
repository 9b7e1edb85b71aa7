"""Masked-LM pre-training in PyTorch: HF's `AutoModelForMaskedLM` carries the head (decoder tied to the word
embeddings); this module gives the per-token cross-entropy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.nn.functional as F

import torch
from tpuplex.tasks.masked_lm.heads import MaskedLMHead


def head_config(head: MaskedLMHead) -> dict[str, Any]:
    """The head's sizes come from the encoder's config: nothing to add."""
    return {}


def unit_losses(outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Per-token cross-entropy [b, L] in float32 of logits [b, L, V] against the original ids."""
    rows, length, vocab = outputs.shape
    losses = F.cross_entropy(outputs.float().reshape(-1, vocab), batch["labels"].reshape(-1), reduction="none")
    return losses.view(rows, length)


def predict_outputs(outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """float32 [b, L, 2]: each token's cross-entropy and 1.0 where the most likely token is the label."""
    correct = (outputs.argmax(dim=-1) == batch["labels"]).float()
    return torch.stack([unit_losses(outputs, batch), correct], dim=-1)

"""Masked-LM pre-training in PyTorch: HF's `AutoModelForMaskedLM` carries the head (decoder tied to the word
embeddings); this module runs that head on the masked positions and gives their cross-entropy."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tpuplex.tasks import torch as tasks_torch
from tpuplex.tasks.masked_lm.heads import FAMILY_HEADS

_HEAD_CALLS = {name: head.calls for head in FAMILY_HEADS.values() for name in head.hf_classes}


class Module(tasks_torch.TaskModule):
    def forward(self, model: torch.nn.Module, encoder_inputs: Mapping[str, torch.Tensor],
                batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """HF's `*ForMaskedLM` forward in two parts: the encoder on every position, then the family's head on
        `batch["masked_positions"]` [b, P] only (every position without it) -> logits [b, P, V]."""
        hidden = model.base_model(**encoder_inputs)[0]
        positions = batch.get("masked_positions")
        if positions is not None:
            hidden = torch.gather(hidden, 1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
        for name in _HEAD_CALLS[type(model).__name__]:
            hidden = model.get_submodule(name)(hidden)
        return hidden

    def unit_losses(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-position cross-entropy [b, P] in float32 of logits [b, P, V] against the original ids."""
        return tasks_torch.token_losses(outputs, batch["labels"])

    def predict_outputs(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """float32 [b, P, 2]: each position's cross-entropy and 1.0 where the most likely token is the label."""
        return tasks_torch.token_outputs(outputs, batch["labels"])

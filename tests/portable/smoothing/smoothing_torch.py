"""Label-smoothed cross-entropy in PyTorch; the head and predictions are the built-in classifier's."""

import torch.nn.functional as F
from smoothing import SMOOTHING

import torch
from tpuplex_torch.tasks import sequence_classification as classification


class Module(classification.Module):
    def unit_losses(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """[b]: cross-entropy of logits [b, C] against smoothed one-hot labels."""
        return F.cross_entropy(outputs.float(), batch["labels"], reduction="none", label_smoothing=SMOOTHING)

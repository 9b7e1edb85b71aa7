"""FlowersCNN as a `torch.nn.Module` (see flowers_cnn/__init__.py)."""

from __future__ import annotations

import torch
from flowers_cnn import CHANNELS, DROPOUT


class FlowersCNN(torch.nn.Module):
    def __init__(self, num_labels: int, image_shape: tuple[int, int, int]):
        super().__init__()
        blocks, channels = [], image_shape[-1]
        for width in CHANNELS:
            blocks += [torch.nn.Conv2d(channels, width, 3, padding=1, bias=False), torch.nn.BatchNorm2d(width),
                       torch.nn.ReLU(), torch.nn.MaxPool2d(2)]
            channels = width
        self.features = torch.nn.Sequential(*blocks)
        self.dropout = torch.nn.Dropout(DROPOUT)
        self.classifier = torch.nn.Linear(channels, num_labels)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        pooled = self.features(images).mean(dim=(2, 3))  # [B, C, H, W] -> [B, C]
        return self.classifier(self.dropout(pooled))

"""TextCNN as a `torch.nn.Module` (see textcnn/__init__.py)."""

from __future__ import annotations

import torch
from native_textcnn import DROPOUT, EMBEDDING_SIZE, FILTERS, WIDTHS


class TextCNN(torch.nn.Module):
    def __init__(self, vocab_size: int, num_labels: int):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, EMBEDDING_SIZE)
        self.convolutions = torch.nn.ModuleList(
            torch.nn.Conv1d(EMBEDDING_SIZE, FILTERS, width, padding="same") for width in WIDTHS)
        self.dropout = torch.nn.Dropout(DROPOUT)
        self.classifier = torch.nn.Linear(FILTERS * len(WIDTHS), num_labels)

    def forward(self, input_ids, token_type_ids, attention_mask) -> torch.Tensor:
        tokens = self.embedding(input_ids).transpose(1, 2)  # [B, E, L]: Conv1d wants channels first
        padding = attention_mask[:, None, :] == 0
        # ReLU outputs are >= 0, so zeroing padded positions leaves the maximum over real ones unchanged.
        pooled = [conv(tokens).relu().masked_fill(padding, 0.0).amax(dim=-1) for conv in self.convolutions]
        return self.classifier(self.dropout(torch.cat(pooled, dim=-1)))

"""Speech recognition in PyTorch: the model's call, each utterance's CTC loss and the predict outputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch.nn.functional as F

import torch
from tpuplex.models.conformer import SERVED_FRAMES
from tpuplex.tasks.speech_recognition.data import BLANK
from tpuplex_torch import tasks as tasks_torch


class Module(tasks_torch.TaskModule):
    not_on_xla = ("torch's ctc_loss has no XLA lowering (pytorch/xla#2399, open since 2020), and a CTC of our own in "
                  "tensor ops is not written yet")
    def model_inputs(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """features float32 [b, T, mel] and attention_mask [b, T]."""
        return batch["features"], batch["attention_mask"]

    def unit_losses(self, outputs: tuple, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """float32 [b]: each utterance's CTC loss over its transcript's length (HF's "mean" reduction); 0 where
        the model's frames cannot hold the transcript (`feasible`), as HF's `ctc_zero_infinity`."""
        logits, frames = outputs
        fits = feasible(frames, batch["labels"])
        labels = torch.where(fits[:, None], batch["labels"], BLANK)  # no transcript: a finite loss, and 0 by where
        label_lengths = (labels != BLANK).sum(dim=1)
        log_probs = F.log_softmax(logits.float(), dim=-1).transpose(0, 1)  # [T', b, V]
        losses = F.ctc_loss(log_probs, labels, frames.clamp(min=0), label_lengths, blank=BLANK, reduction="none")
        return torch.where(fits, losses / label_lengths.clamp(min=1), torch.zeros_like(losses))

    def predict_outputs(self, outputs: tuple, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """float32 [b, T, 2]: each output frame's most likely symbol (-1 past the utterance's output frames, and
        on to the T input frames) and the utterance's loss."""
        logits, frames = outputs
        rows, length = batch["features"].shape[:2]
        ids = logits.argmax(dim=-1)
        ids = torch.where(torch.arange(ids.shape[1], device=ids.device)[None, :] < frames[:, None], ids, -1)
        ids = F.pad(ids, (0, length - ids.shape[1]), value=-1).float()
        losses = self.unit_losses(outputs, batch)[:, None].expand(rows, length)
        return torch.stack([ids, losses], dim=-1)


    def serving(self, model: torch.nn.Module, data: Any) -> tuple[torch.nn.Module, tuple, dict, dict]:
        """A speech run's program over log-mel features (`tpuplex.data.audio.LogMel`, which the contract
        describes): the batch and frame dimensions dynamic, greedy CTC ids out."""
        mel_bins = data.options.features.mel_bins
        example = (torch.zeros((2, 200, mel_bins)), torch.ones((2, 200), dtype=torch.int64))
        batch, frames = torch.export.Dim("batch", min=1), torch.export.Dim("frames", min=16, max=4 * SERVED_FRAMES)
        contract = {"inputs": {"features": f"float32 [batch, frames, {mel_bins}] log-mel features",
                               "attention_mask": "int64 [batch, frames]: 1 on each recording's frames, 0 after"},
                    "features": {**dataclasses.asdict(data.options.features),
                                 "rule": "tpuplex.data.audio.LogMel: frames of frame_ms every hop_ms, a Hann window, "
                                         "|rfft|^2 through mel_bins HTK mel filters, log(x + 1e-6)"},
                    "outputs": ["ids int64 [batch, output frames]: each output frame's most likely symbol, -1 past "
                                "the recording's frames"],
                    "decoding": "CTC greedy: merge repeated ids, drop the blank 0, id i is characters[i - 1]",
                    "characters": data.vocabulary.characters}
        shapes = {"features": {0: batch, 1: frames}, "attention_mask": {0: batch, 1: frames}}
        return Serving(model), example, shapes, contract


class Serving(torch.nn.Module):
    """features float32 [batch, frames, mel], attention_mask int64 [batch, frames] -> ids int64 [batch, T']."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, features: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        logits, frames = self.model(features, attention_mask)
        ids = logits.argmax(dim=-1)
        return torch.where(torch.arange(ids.shape[1], device=ids.device)[None, :] < frames[:, None], ids, -1)


def feasible(frames: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """bool [b]: whether T' frames can align the transcript: one frame a symbol, and a blank between repeats."""
    repeats = ((labels[:, 1:] == labels[:, :-1]) & (labels[:, 1:] != BLANK)).sum(dim=1)
    return frames >= (labels != BLANK).sum(dim=1) + repeats

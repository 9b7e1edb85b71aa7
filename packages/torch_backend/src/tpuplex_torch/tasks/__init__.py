"""The contract of a task's PyTorch module, what the torch backend and the model kinds call.

A task's module here (`tpuplex_torch.tasks.<task>`, or a module of your own task's) subclasses `TaskModule` and
`Task.backends["torch"]` names the class ("package.module:Class").
Batches here are dicts of tensors: the model's inputs, `labels` and `weight` (the task's loss units), and the
head's inputs (`tpuplex.protocol.head_inputs`).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import torch.nn.functional as F

import torch
from tpuplex import tasks
from tpuplex.errors import TpuplexError
from tpuplex.protocol import TEXT_INPUTS


class TaskModule(abc.ABC):
    """A task in PyTorch: what the model is called with, its losses and serving (a text encoder's head is the
    task's `Head.forward`, `tpuplex.tasks.base`, written once)."""

    name: str = ""
    """The task's name, set by `load`."""
    not_on_xla: str = ""
    """Why the task cannot run on torch_xla (an op with no XLA lowering); empty: it can."""

    def model_inputs(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """What a model of your own is called with: input_ids, token_type_ids, attention_mask int64 [b, L]."""
        return tuple(batch[name] for name in TEXT_INPUTS)

    @abc.abstractmethod
    def unit_losses(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """float32 losses of the task's units, the shape of batch["weight"]."""

    @abc.abstractmethod
    def predict_outputs(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """What `Backend.predict` returns per row."""

    def serving(self, model: torch.nn.Module, data: Any) -> tuple[torch.nn.Module, tuple, dict, dict]:
        """What `tpuplex export --format torch_export` writes: the wrapper, an example input, the dynamic shapes
        and serving.json's contract."""
        raise TpuplexError(f"the {self.name} task has no torch_export format: use tpuplex export --format hf (a "
                           "folder transformers' AutoModelFor... loads in plain torch)")


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy float32 [b, P] of logits [b, P, V] against labels [b, P] (language modelling)."""
    rows, length, vocab = logits.shape
    losses = F.cross_entropy(logits.float().reshape(-1, vocab), labels.reshape(-1), reduction="none")
    return losses.view(rows, length)


def token_outputs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """float32 [b, P, 2]: each token's cross-entropy and 1.0 where the most likely token is the label (what
    `tpuplex.tasks.base.token_metrics` reads)."""
    correct = (logits.argmax(dim=-1) == labels).float()
    return torch.stack([token_losses(logits, labels), correct], dim=-1)


def load(task: Any) -> TaskModule:
    """The task's PyTorch module (`Task.backends["torch"]`), checked to be a `TaskModule`."""
    return tasks.framework_module(task, "torch", TaskModule)

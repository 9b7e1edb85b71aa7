"""A trained model as a `torch.export` program: `tpuplex export RUN --format torch_export`.

    <folder>/model.pt2       torch.export.save of the model in inference mode with the task's serving wrapper
    <folder>/serving.json    what the program takes and returns, and the task's serving facts (classes, size)

Plain torch loads it: `torch.export.load("model.pt2").module()(inputs)`. The task's torch module says what the
program wraps (`TaskModule.serving(model, data)`); tasks without one are exported as HF folders instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tpuplex_torch.tasks import TaskModule


def torch_export(model: torch.nn.Module, task: TaskModule, folder: Path, data: Any) -> None:
    """Write `model` (in eval mode, on the CPU) wrapped by the task's serving module into `folder`."""
    wrapper, example, dynamic_shapes, contract = task.serving(model.cpu().eval(), data)
    program = torch.export.export(wrapper, example, dynamic_shapes=dynamic_shapes)
    torch.export.save(program, folder / "model.pt2")
    (folder / "serving.json").write_text(json.dumps(contract, indent=2) + "\n")

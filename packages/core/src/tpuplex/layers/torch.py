"""What every PyTorch module of tpuplex shares: activations by HF name, and parameters registered under dotted
names.

A framework module (docs/ARCHITECTURE.md): imported by the torch backend and the `torch.py` of tasks and model
kinds only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch.nn.functional as F

import torch

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,  # HF "gelu" is the exact erf form
    "gelu_new": functools.partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "tanh": torch.tanh,
    "silu": F.silu,
}


def register_parameters(root: torch.nn.Module, params: Mapping[str, Any]) -> dict[str, tuple[torch.nn.Module, str]]:
    """Register each array of `params` on `root` under its dotted name (`a.b.weight`: submodule a, its submodule b,
    parameter weight), so `named_parameters()` gives those names; returns name -> (owner module, attribute)."""
    slots = {}
    for name, array in params.items():
        *path, leaf = name.split(".")
        owner = root
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        owner.register_parameter(leaf, torch.nn.Parameter(torch.from_numpy(np.array(array))))
        slots[name] = (owner, leaf)
    return slots

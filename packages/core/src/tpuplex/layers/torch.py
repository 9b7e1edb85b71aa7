"""What every PyTorch module of tpuplex shares: activations by HF name.

A framework module (docs/ARCHITECTURE.md): imported by the torch backend and the `torch.py` of tasks and model
kinds only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

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

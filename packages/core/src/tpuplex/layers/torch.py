"""What every PyTorch module of tpuplex shares: activations by HF name, and parameters registered under dotted
names.

A framework module (docs/ARCHITECTURE.md): imported by the torch backend and the `torch.py` of tasks and model
kinds only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

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


class Layer(torch.nn.Module):
    """A layer of one of tpuplex's own modules (a decoder block): what FSDP2 gathers as one unit, so its forward
    must be called as a module (its parameters read inside it)."""


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's layers, which FSDP2 shards one unit each: the entries of an HF model's layer lists
    (`ModuleList`) and tpuplex's own `Layer`s."""
    found = [block for child in model.modules() if isinstance(child, torch.nn.ModuleList) for block in child]
    return found + [child for child in model.modules() if isinstance(child, Layer)]


def register_parameters(root: torch.nn.Module, shapes: Mapping[str, tuple[int, ...]]
                        ) -> dict[str, tuple[torch.nn.Module, str]]:
    """Register a float32 parameter of each shape in `shapes` on `root` under its dotted name (`a.b.weight`:
    submodule a, its submodule b, parameter weight), so `named_parameters()` gives those names; returns name ->
    (owner module, attribute). The values are left unset: the backend restores the initial state into them."""
    slots = {}
    for name, shape in shapes.items():
        owner, leaf = _parent(root, name)
        owner.register_parameter(leaf, torch.nn.Parameter(torch.empty(tuple(shape), dtype=torch.float32)))
        slots[name] = (owner, leaf)
    return slots


def add_module_at(root: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    """Add `module` to `root` under the dotted `name`."""
    owner, leaf = _parent(root, name)
    owner.add_module(leaf, module)


def _parent(root: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    """The module that holds the dotted `name` under `root` (missing ones made plain `Module`s), and its last
    part."""
    *path, leaf = name.split(".")
    owner = root
    for part in path:
        if not hasattr(owner, part):
            owner.add_module(part, torch.nn.Module())
        owner = getattr(owner, part)
    return owner, leaf

"""What every PyTorch module of tpuplex shares: activations by HF name, parameters registered under dotted names,
and the table of operations the networks written once run on (`TorchOps`, `tpuplex.models.ops`).

The torch backend's table (docs/ARCHITECTURE.md): its steps, and its kinds' and tasks' modules, build on it.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np
import torch.nn.functional as F

import torch
from tpuplex.models.conformer import SERVED_FRAMES
from tpuplex.models.conformer import positions as sinusoidal_positions

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,  # HF "gelu" is the exact erf form
    "gelu_new": functools.partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "tanh": torch.tanh,
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
}


class Layer(torch.nn.Module):
    """A layer of one of tpuplex's own modules (a decoder block): what FSDP2 gathers as one unit, so its forward
    must be called as a module (its parameters read inside it)."""


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's layers, which FSDP2 shards one unit each: the entries of an HF model's layer lists
    (`ModuleList`) and tpuplex's own `Layer`s."""
    found = [block for child in model.modules() if isinstance(child, torch.nn.ModuleList) for block in child]
    return found + [child for child in model.modules() if isinstance(child, Layer)]


Slots = Mapping[str, tuple[torch.nn.Module, str]]
"""Parameter name -> (the module that holds it, its attribute there): what `register_parameters` returns."""


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


def read_slots(slots: Slots) -> dict[str, torch.Tensor]:
    """The parameters `slots` name, as their modules hold them now (under FSDP2, gathered by then)."""
    return {name: getattr(owner, leaf) for name, (owner, leaf) in slots.items()}


def common_prefix(names: Iterable[str]) -> str:
    """The dotted prefix every name in `names` shares (`model.layers.3` of a layer's HF names)."""
    return ".".join(os.path.commonprefix([name.split(".") for name in names]))


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


class Float8Matmuls:
    """torchao's float8 training for the matrix products `TorchOps.linear` is given (`train.fp8`): each input and
    weight cast to float8 e4m3 with a scale from its absolute maximum, the output's gradient to e5m2, products by
    `torch._scaled_mm` (emulated in float32 where the chip has no float8), as torchao's `Float8Linear.forward` does;
    the networks written once hold their weights as parameters, not `nn.Linear` modules, so the module swap
    (`convert_to_float8_training`) would find nothing to swap. Products whose sides are not multiples of 16 (what
    `_scaled_mm` takes: a classifier's few labels) stay in bf16."""

    def __init__(self, emulate: bool):
        from torchao.float8 import Float8LinearConfig, LinearMMConfig, ScaledMMConfig
        from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

        self.config = config = Float8LinearConfig(emulate=emulate)
        gemms = (config.gemm_config_output, config.gemm_config_grad_input, config.gemm_config_grad_weight)
        self.mm_config = LinearMMConfig(*(ScaledMMConfig(emulate, gemm.use_fast_accum, False, config.pad_inner_dim)
                                          for gemm in gemms))
        self.matmul = matmul_with_hp_or_float8_args.apply

    def __call__(self, x: torch.Tensor, weight_in_out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        out = self.matmul(x, weight_in_out, self.mm_config, self.config)
        return out if bias is None else out + bias.to(out.dtype)

    @staticmethod
    def takes(weight: torch.Tensor) -> bool:
        return weight.dim() == 2 and weight.shape[0] % 16 == 0 and weight.shape[1] % 16 == 0


_float8: Float8Matmuls | None = None
"""The float8 products `TorchOps.linear` runs while a train step's forward is traced or run (`float8_products`)."""


@contextlib.contextmanager
def float8_products(matmuls: Float8Matmuls | None) -> Iterator[None]:
    """`TorchOps.linear` computes in float8 by `matmuls` inside (None: as it is)."""
    global _float8
    previous, _float8 = _float8, matmuls
    try:
        yield
    finally:
        _float8 = previous


class TorchOps:
    """`tpuplex.models.ops.Ops` in torch: dropout from torch's generator when `training`; attention through
    `scaled_dot_product_attention` (its fused causal kernels when the mask is plain causal), written out only where
    the scores are soft-capped. Under autocast the Linear layers compute in bfloat16 as torch chooses, inside
    `float8_products` in float8."""

    def __init__(self, training: bool, device: torch.device):
        self.training, self.device = training, device

    where = staticmethod(torch.where)
    einsum = staticmethod(torch.einsum)
    cos = staticmethod(torch.cos)
    sin = staticmethod(torch.sin)
    tanh = staticmethod(torch.tanh)

    def linear(self, x, weight, bias, in_out=False):
        if _float8 is not None and Float8Matmuls.takes(weight):
            return _float8(x, weight if in_out else weight.t(), bias)
        if not in_out:
            return F.linear(x, weight, bias)
        # [in, out] (GPT-2's Conv1D): x @ W, whose weight gradient x^T @ g needs no transpose of W
        flat = x.reshape(-1, x.shape[-1])
        out = flat @ weight if bias is None else torch.addmm(bias, flat, weight)
        return out.view(*x.shape[:-1], weight.shape[1])

    def embed(self, table, ids):
        return F.embedding(ids, table)

    def attention(self, query, key, value, mask, causal, scale, softcap, dropout, site, bias=None):
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))  # [B, heads, T, D]
        rate = dropout if self.training else 0.0
        if causal and not softcap and bias is None:
            return F.scaled_dot_product_attention(query, key, value, attn_mask=None, is_causal=True, scale=scale,
                                                  dropout_p=rate, enable_gqa=key.shape[1] != query.shape[1]
                                                  ).transpose(1, 2)
        # Hidden keys get the dtype's most negative number, not -inf, so a query that sees none stays finite.
        hidden = torch.tensor(torch.finfo(query.dtype).min, dtype=query.dtype, device=query.device)
        additive = torch.where(mask[:, None], 0.0 if bias is None else bias.to(query.dtype), hidden)
        if not softcap:
            return F.scaled_dot_product_attention(query, key, value, attn_mask=additive, is_causal=False, scale=scale,
                                                  dropout_p=rate, enable_gqa=key.shape[1] != query.shape[1]
                                                  ).transpose(1, 2)
        groups = query.shape[1] // key.shape[1]
        key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
        scores = torch.tanh(query @ key.transpose(-1, -2) * (scale / softcap)) * softcap + additive
        probs = F.dropout(torch.softmax(scores.float(), dim=-1).to(value.dtype), rate, self.training)
        return (probs @ value).transpose(1, 2)

    def layer_norm(self, x, weight, bias, eps):
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)

    def rms_norm(self, x, weight, eps, offset=0.0):
        return F.rms_norm(x, (x.shape[-1],), weight + offset if offset else weight, eps)

    def activation(self, name, x):
        return ACTIVATIONS[name](x)

    def softmax(self, x):
        return torch.softmax(x, dim=-1)

    def reshape(self, x, shape):
        return x.reshape(shape)

    def transpose(self, x, axes):
        return x.permute(axes)

    def concat(self, tensors, axis):
        return torch.cat(tensors, dim=axis)

    def split(self, x, sizes):
        return x.split(sizes, dim=-1)

    def shape(self, x):
        return tuple(x.shape)

    def constant(self, array):
        return torch.from_numpy(np.asarray(array)).to(self.device)

    def arange(self, count):
        return torch.arange(count, device=self.device)

    def float32(self, x):
        return x.float()

    def cast_like(self, x, like):
        return x.to(like.dtype)

    def dropout(self, x, rate, site):
        return F.dropout(x, rate, self.training) if rate else x

    def cache_write(self, cache, new, index):
        return cache.index_copy_(1, index + torch.arange(new.shape[1], device=new.device), new.to(cache.dtype))

    def conv2d(self, x, weight, bias, stride):
        return F.conv2d(x, weight, bias, stride=stride)

    def depthwise_conv1d(self, x, weight, bias):
        return F.conv1d(x.transpose(1, 2), weight, bias, padding=weight.shape[-1] // 2,
                        groups=weight.shape[0]).transpose(1, 2)

    def positions(self, frames, width):
        if isinstance(frames, int):
            return self.constant(sinusoidal_positions(frames, width))
        # torch.export traces `frames` as a symbol: a table of the most frames a program takes, cut to them.
        return self.constant(sinusoidal_positions(SERVED_FRAMES, width))[:frames]

    def frame_mask(self, lengths, frames):
        return (torch.arange(frames, device=lengths.device)[None, :] < lengths[:, None]).float()

    def padded_attention(self, query, key, value, key_mask, scale, dropout, site):
        # The mask made on the device from key_mask alone (no scalar uploaded, which a GPU would wait for): 0 on
        # kept keys, the dtype's most negative number on padding, so a row that keeps none stays finite.
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))  # [B, heads, T, D]
        additive = (key_mask[:, None, None, :] == 0).to(query.dtype) * torch.finfo(query.dtype).min
        return F.scaled_dot_product_attention(query, key, value, attn_mask=additive, scale=scale,
                                              dropout_p=dropout if self.training else 0.0).transpose(1, 2)

    def take(self, x, positions):
        return torch.gather(x, 1, positions.reshape(*positions.shape, *(1,) * (x.dim() - 2)).expand(
            *positions.shape, *x.shape[2:]))

    def broadcast_to(self, x, shape):
        return x.expand(shape)

    # torch's convolutions and pools take NCHW: x.permute(0, 3, 1, 2) of a channels-last [B, H, W, C] is that
    # tensor in torch's channels_last memory format (a view, no copy), which its CPU and cuDNN kernels read as it is.
    def conv2d_nhwc(self, x, weight, stride, padding):
        return F.conv2d(x.permute(0, 3, 1, 2), weight, stride=stride, padding=padding).permute(0, 2, 3, 1)

    def max_pool(self, x, window, stride, padding):
        return F.max_pool2d(x.permute(0, 3, 1, 2), window, stride, padding).permute(0, 2, 3, 1)

    def mean(self, x, axes):
        return x.mean(dim=axes)

    def sum(self, x, axes):
        return x.sum(dim=axes)

    def max(self, x, axes):
        return x.amax(dim=axes)

    def conv1d(self, x, weight, bias):
        width = weight.shape[-1]
        padded = F.pad(x.transpose(1, 2), ((width - 1) // 2, width // 2))  # [B, C_in, T + K - 1]
        return F.conv1d(padded, weight.to(x.dtype), None if bias is None else bias.to(x.dtype)).transpose(1, 2)

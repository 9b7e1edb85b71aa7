"""Decoder families in PyTorch, built from the core's `DecoderArch` (`tpuplex.models.decoder`).

`DecoderModel` registers every parameter under its family's HF name, in HF's layout, so `named_parameters()` is a
`from_pretrained` state dict and checkpoints are portable as they are; its forward reads them by canonical name.
Training attends causally through `scaled_dot_product_attention` (the fused kernel nanoGPT uses); decoding writes a
key/value cache of S positions from `cache_index` and masks the prompts' left padding, as the Flax and Keras
decoders do; `generate` runs the loop eagerly, one token per forward.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping

import numpy as np
import torch.nn.functional as F

import torch
from tpuplex.kinds.decoder import parameter_names, parameter_shapes
from tpuplex.kinds.torch import Built, KindModule
from tpuplex.layers.torch import ACTIVATIONS, Layer, add_module_at, register_parameters
from tpuplex.models.decoder import DecoderArch
from tpuplex.models.lora import Lora
from tpuplex.params import check_names
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts

Params = dict[str, torch.Tensor]
"""Canonical name (`block.3.query.weight`) -> parameter."""
Cache = list[tuple[torch.Tensor, torch.Tensor]]
"""Each layer's (keys, values), [B, kv_heads, S, head_dim]."""


class DecoderModel(torch.nn.Module):
    """The decoder: input_ids int64 [B, T] -> next-token logits [B, T, V].

    Training calls it with the ids alone (positions 0..T-1, causal attention). Decoding passes `positions` [B, T],
    `key_mask` [B, S] (0 on the prompts' left padding) and, with a cache (each layer's keys and values over S
    positions, written in place from `cache_index`), returns (logits, the cache).
    """

    def __init__(self, arch: DecoderArch, hf_names: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]],
                 lora: Lora | None = None):
        """hf_names: canonical -> HF name of every parameter; shapes: HF name -> shape (HF layout); lora: the
        adapters among them (`tpuplex.models.lora`), or None. Each layer is a `DecoderBlock` module at its HF
        prefix (`model.layers.3`), so FSDP2 can gather one layer's weights at a time."""
        super().__init__()
        self.arch, self.lora = arch, lora
        in_block = {index: {c: hf for c, hf in hf_names.items() if c.startswith(f"block.{index}.")}
                    for index in range(arch.num_layers)}
        blocks = [DecoderBlock(arch, lora, f"block.{index}") for index in range(arch.num_layers)]
        for block, names in zip(blocks, in_block.values(), strict=True):
            add_module_at(self, _common_prefix(names.values()), block)
        registered = register_parameters(self, {hf_name: shapes[hf_name] for hf_name in hf_names.values()})
        for block, names in zip(blocks, in_block.values(), strict=True):
            block.slots = {canonical: registered[hf_name] for canonical, hf_name in names.items()}
        self.blocks = blocks
        self.slots = {canonical: registered[hf_name] for canonical, hf_name in hf_names.items()
                      if not canonical.startswith("block.")}
        """Canonical name -> (the module that holds the parameter, its attribute there): the parameters outside
        the blocks (embeddings, final norm, LM head)."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None, cache: Cache | None = None,
                cache_index: int = 0, key_mask: torch.Tensor | None = None) -> torch.Tensor | tuple:
        a, p = self.arch, _read(self.slots)
        length, device = input_ids.shape[1], input_ids.device
        if positions is None:
            positions = torch.arange(length, device=device).expand_as(input_ids)
        x = F.embedding(input_ids, p["embeddings.word.weight"])
        if not a.rope_theta:
            x = x + F.embedding(positions, p["embeddings.position.weight"])
        x = F.dropout(x, a.embedding_dropout, self.training)
        mask = None
        if key_mask is not None:
            keys = length if cache is None else cache[0][0].shape[2]
            mask = attention_mask(keys, length, cache_index, key_mask, x.dtype)
        updated = []
        for index, block in enumerate(self.blocks):
            x, entry = block(x, positions, mask, None if cache is None else cache[index], cache_index)
            updated.append(entry)
        x = norm(x, a, p, "final_norm")
        logits = F.linear(x, p["embeddings.word.weight" if a.tied else "lm_head.weight"])
        return logits if cache is None else (logits, updated)


class DecoderBlock(Layer):
    """One pre-norm decoder layer: [B, T, H] -> ([B, T, H], its updated cache entry or None). Its parameters are
    registered below it under their HF names; `slots` maps their canonical names (`block.3.query.weight`) to
    (owner module, attribute), read when the forward runs (FSDP2 has gathered them by then)."""

    def __init__(self, arch: DecoderArch, lora: Lora | None, name: str):
        super().__init__()
        self.arch, self.lora, self.name = arch, lora, name
        self.slots: dict[str, tuple[torch.nn.Module, str]] = {}

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: tuple | None,
                cache_index: int) -> tuple[torch.Tensor, tuple | None]:
        """mask: None (causal over the rows) or additive [B, 1, T, S]."""
        a, p, name = self.arch, _read(self.slots), self.name
        rows, length = x.shape[:2]
        heads, kv, size = a.num_heads, a.num_kv_heads, a.head_dim
        h = norm(x, a, p, f"{name}.attention_norm")
        if a.fused_qkv:
            query, key, value = self.project(h, p, f"{name}.qkv").split([heads * size, kv * size, kv * size], dim=-1)
        else:
            query, key, value = (self.project(h, p, f"{name}.{part}") for part in ("query", "key", "value"))
        query = query.view(rows, length, heads, size).transpose(1, 2)
        key, value = (t.view(rows, length, kv, size).transpose(1, 2) for t in (key, value))
        if a.rope_theta:
            query, key = rotary(query, positions, a.rope_theta), rotary(key, positions, a.rope_theta)
        if cache is not None:
            written = cache_index + torch.arange(length, device=x.device)
            key, value = cache[0].index_copy_(2, written, key), cache[1].index_copy_(2, written, value)
        context = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, is_causal=mask is None, scale=1 / math.sqrt(size),
            dropout_p=a.attention_dropout if self.training else 0.0, enable_gqa=kv != heads)
        attended = self.project(context.transpose(1, 2).reshape(rows, length, heads * size), p,
                                f"{name}.attention_output")
        x = x + F.dropout(attended, a.residual_dropout, self.training)
        h = norm(x, a, p, f"{name}.mlp_norm")
        inner = ACTIVATIONS[a.activation](self.project(h, p, f"{name}.{'gate' if a.gated_mlp else 'up'}"))
        if a.gated_mlp:
            inner = inner * self.project(h, p, f"{name}.up")
        out = self.project(inner, p, f"{name}.down")
        return x + F.dropout(out, a.residual_dropout, self.training), cache

    def project(self, x: torch.Tensor, p: Params, name: str) -> torch.Tensor:
        """The projection `name` of x [..., in] -> [..., out], with its LoRA adapter when it has one:
        + scale * B A dropout(x)."""
        y = linear(x, self.arch, p, name)
        if self.lora is None or not self.lora.adapts(name):
            return y
        low = F.linear(F.dropout(x, self.lora.dropout, self.training), p[f"{name}.lora_A.weight"])
        return y + F.linear(low, p[f"{name}.lora_B.weight"]) * self.lora.scale


def _read(slots: Mapping[str, tuple[torch.nn.Module, str]]) -> Params:
    """The parameters `slots` name, as their modules hold them now."""
    return {name: getattr(owner, leaf) for name, (owner, leaf) in slots.items()}


def _common_prefix(names: Iterable[str]) -> str:
    """The dotted prefix every name in `names` shares (`model.layers.3` of a layer's HF names)."""
    return ".".join(os.path.commonprefix([name.split(".") for name in names]))


def linear(x: torch.Tensor, arch: DecoderArch, p: Params, name: str) -> torch.Tensor:
    """x [..., in] -> [..., out] through the projection `name` (its weight in the family's `kernel_layout`)."""
    weight, bias = p[f"{name}.weight"], p.get(f"{name}.bias")
    if arch.kernel_layout == "out_in":
        return F.linear(x, weight, bias)
    # [in, out] (GPT-2's Conv1D): x @ W, whose weight gradient x^T @ g needs no transpose of W
    flat = x.reshape(-1, x.shape[-1])
    out = flat @ weight if bias is None else torch.addmm(bias, flat, weight)
    return out.view(*x.shape[:-1], weight.shape[1])


def norm(x: torch.Tensor, arch: DecoderArch, p: Params, name: str) -> torch.Tensor:
    if arch.rms_norm:
        return F.rms_norm(x, (arch.hidden_size,), p[f"{name}.weight"], arch.norm_eps)
    return F.layer_norm(x, (arch.hidden_size,), p[f"{name}.weight"], p.get(f"{name}.bias"), arch.norm_eps)


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """HF Llama's rotary embedding of x [B, heads, T, D] at positions [B, T] (halves rotated, not pairs)."""
    half = x.shape[-1] // 2
    inverse = 1.0 / (theta ** (torch.arange(0, half, dtype=torch.float32, device=x.device) * 2 / x.shape[-1]))
    angles = positions[..., None].float() * inverse  # [B, T, D/2]
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1)[:, None].to(x.dtype) for f in (torch.cos, torch.sin))
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def attention_mask(keys: int, length: int, cache_index: int, key_mask: torch.Tensor, dtype: torch.dtype
                   ) -> torch.Tensor:
    """Additive [B, 1, T, S]: query t (at cache_index + t) sees the keys up to itself that key_mask [B, S] keeps.
    Hidden keys get the dtype's most negative number, not -inf, so a padding query that sees none stays finite."""
    device = key_mask.device
    sees = torch.arange(keys, device=device)[None, :] <= cache_index + torch.arange(length, device=device)[:, None]
    sees = sees[None] & key_mask[:, None, :].bool()
    return torch.zeros(sees.shape, dtype=dtype, device=device).masked_fill(~sees, torch.finfo(dtype).min)[:, None]


def sample(logits: torch.Tensor, temperature: float, top_k: int, uniform: torch.Tensor) -> torch.Tensor:
    """int64 [B]: the most likely token of logits [B, V] (temperature 0), else the token where the CDF of
    softmax(logits / temperature), restricted to the top_k, first exceeds uniform [B]."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / temperature
    if top_k:
        kth = torch.topk(scaled, min(top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    cdf = torch.softmax(scaled, dim=-1).cumsum(dim=-1)
    chosen = (cdf < uniform[:, None] * cdf[:, -1:]).sum(dim=-1)
    return chosen.clamp(max=logits.shape[-1] - 1)


def logits(model: DecoderModel, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The next-token logits [b, L, V] of `input_ids` [b, L] (causal attention: no padding mask is needed, padding
    sits after every real token and is weighted 0)."""
    return model(batch["input_ids"])


class Decoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        lora = spec.lora if spec.dropout or spec.lora is None else spec.lora.without_dropout()
        check_names(parameter_shapes(spec), spec.params, "model.params")
        return Built(DecoderModel(arch, parameter_names(spec), parameter_shapes(spec), lora), logits, spec.params)

    def generate(self, model: DecoderModel, prompts: Prompts) -> np.ndarray:
        """The prompts [B, P] through the model once, then one token per forward with the cache of P + N positions
        (or, without it, the whole sequence so far again at every step)."""
        device = next(model.parameters()).device
        rows, length = prompts.ids.shape
        total = length + prompts.new_tokens
        tokens = torch.zeros(rows, total, dtype=torch.int64, device=device)
        tokens[:, :length] = torch.from_numpy(np.asarray(prompts.ids, np.int64))
        key_mask = torch.ones_like(tokens)
        key_mask[:, :length] = torch.from_numpy(np.asarray(prompts.mask, np.int64))
        positions = (key_mask.cumsum(dim=1) - 1).clamp(min=0)
        uniforms = torch.from_numpy(np.asarray(prompts.uniforms, np.float32)).to(device)
        a, dtype = model.arch, next(model.parameters()).dtype
        was_training = model.training
        model.eval()
        with torch.no_grad():
            cache = [(torch.zeros(rows, a.num_kv_heads, total, a.head_dim, dtype=dtype, device=device),
                      torch.zeros(rows, a.num_kv_heads, total, a.head_dim, dtype=dtype, device=device))
                     for _ in range(a.num_layers)]
            begin = 0
            for step in range(prompts.new_tokens):
                end = length + step  # the next token's place
                if prompts.cache:
                    logits, cache = model(tokens[:, begin:end], positions[:, begin:end], cache, begin, key_mask)
                    begin = end
                else:
                    logits = model(tokens[:, :end], positions[:, :end], key_mask=key_mask[:, :end])
                tokens[:, end] = sample(logits[:, -1].float(), prompts.temperature, prompts.top_k, uniforms[:, step])
        model.train(was_training)
        return tokens[:, length:].cpu().numpy().astype(np.int32)

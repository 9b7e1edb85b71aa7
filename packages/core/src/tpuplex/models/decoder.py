"""A decoder language model written once: its architecture (`DecoderArch`, read from an HF `config.json` by its
`DecoderFamily`), its parameters and its forward pass (`forward`) over the operations each framework gives
(`tpuplex.models.ops.Ops`), so GPT-2, Llama, Qwen2, Mistral, Gemma 2 and Phi-3 are one network up to switches:

    embeddings   word [+ learned position] [* sqrt(hidden)] -> dropout
    blocks       pre-norm:  x += [post_norm] attention(norm(x));  x += [post_norm] mlp(norm(x))
                 attention: causal, grouped-query (kv heads <= heads), [rotary positions], fused or separate q/k/v,
                            [a sliding window on some layers], [scores soft-capped]
                 mlp:       down(act(up(x)))  or, gated,  down(act(gate(x)) * up(x))  (gate and up fused or not)
    final norm -> LM head (tied to the word embeddings, or its own) [logits soft-capped]

Parameters have canonical names (`embeddings.word.weight`, `block.3.query.weight`, `lm_head.weight`, ...), which a
`DecoderFamily` maps to the HF names its checkpoints use. Their portable layout is HF's: Llama's Linear weights
[out, in], GPT-2's Conv1D weights [in, out] (`kernel_layout`), so a portable checkpoint is a `from_pretrained`
state dict as it is, and every framework holds those arrays as they are.

A family is one file (`tpuplex.models.<family>`): how its config.json reads into a `DecoderArch`, its HF module
names, its PEFT target modules. Rotary positions, LoRA, masks, sliding windows, soft-capping and the key/value
cache are written here, once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from tpuplex import flops
from tpuplex.errors import TpuplexError
from tpuplex.initializers import drawn_as_hf
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.ops import Ops
from tpuplex.models.rope import Rope
from tpuplex.slices import SliceReader

DECODER_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu")
"""Activation names (HF's spelling) every backend implements for decoders; "gelu" is the exact erf form."""


@dataclasses.dataclass(frozen=True)
class DecoderArch:
    """Sizes and switches of one decoder, read from an HF `config.json` by its `DecoderFamily`.

    num_kv_heads: key/value heads (grouped-query attention; = num_heads without it); head_dim: per head.
    rope: rotary positions (`tpuplex.models.rope.Rope`: its type, base and scaling), or None: learned position
        embeddings of `max_positions` rows instead (GPT-2).
    rms_norm: RMSNorm (weight only) rather than LayerNorm; norm_bias: the LayerNorms have a bias; norm_offset: the
        RMSNorm scales by offset + weight (Gemma stores its scale less one).
    post_norms: the attention's and the MLP's outputs are normed again before the residual add (Gemma 2).
    fused_qkv: one projection to [q | k | v] (GPT-2's c_attn, Phi-3's qkv_proj) rather than three.
    gated_mlp: down(act(gate(x)) * up(x)) (SwiGLU, GeGLU) rather than down(act(up(x)));
    fused_gate_up: gate and up as one projection to [gate | up] (Phi-3's gate_up_proj).
    qkv_bias, output_bias: the query/key/value projections and the attention's output projection have biases
        (Qwen2: the first only).
    kernel_layout: "in_out" (GPT-2's Conv1D, [in, out]) or "out_in" (torch Linear, [out, in]).
    tied: the LM head is the word embedding table.
    embedding_scale: the word embeddings are multiplied by it (Gemma: sqrt(hidden)).
    attention_scale: the scores' factor (1 / sqrt(head_dim), Gemma 2: query_pre_attn_scalar ** -0.5).
    windows: per layer, the sliding window a query sees (the keys at most window - 1 positions before it; 0: every
        key before it). Mistral slides on every layer, Gemma 2 on every other one.
    attention_softcap, logit_softcap: scores (logits) become cap * tanh(s / cap) (Gemma 2; 0: not capped).
    scaled_output_init: residual projections drawn with std / sqrt(2 * layers) (GPT-2's init).
    """

    family: str
    vocab_size: int
    """0 where config.json leaves it to the run's tokenizer (`tpuplex.kinds.decoder`)."""
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_positions: int
    rope: Rope | None
    rms_norm: bool
    norm_bias: bool
    norm_eps: float
    activation: str
    fused_qkv: bool
    gated_mlp: bool
    qkv_bias: bool
    output_bias: bool
    mlp_bias: bool
    kernel_layout: str
    tied: bool
    embedding_dropout: float
    attention_dropout: float
    residual_dropout: float
    initializer_range: float
    scaled_output_init: bool
    fused_gate_up: bool = False
    norm_offset: float = 0.0
    post_norms: bool = False
    embedding_scale: float = 1.0
    attention_scale: float = 0.0
    """0: 1 / sqrt(head_dim)."""
    windows: tuple[int, ...] = ()
    """Empty: no layer slides."""
    attention_softcap: float = 0.0
    logit_softcap: float = 0.0

    @property
    def max_length(self) -> int:
        """The longest sequence the model takes: its position table, or its rotary table's context
        (`tpuplex.models.rope.Rope.context`)."""
        return self.max_positions if self.rope is None else self.rope.context

    @property
    def scale(self) -> float:
        return self.attention_scale or 1 / math.sqrt(self.head_dim)

    def window(self, layer: int) -> int:
        return self.windows[layer] if self.windows else 0

    def forward_flops(self, rows: int, length: int, targets: int | None = None) -> float:
        """Forward FLOPs over [rows, length] tokens (`tpuplex.flops`): every layer's projections (grouped keys and
        values at their own width) and attention, and the LM head over the vocabulary at `targets` positions a row
        (`forward`'s target_positions; None: every one)."""
        hidden, heads, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        mlp = (3 if self.gated_mlp else 2) * hidden * self.intermediate_size
        layer = flops.transformer_layer_flops(rows, length, heads, 2 * hidden * heads + 2 * hidden * kv + mlp)
        head_rows = length if targets is None else targets
        return self.num_layers * layer + 2.0 * rows * head_rows * hidden * self.vocab_size

    def without_dropout(self) -> DecoderArch:
        return dataclasses.replace(self, embedding_dropout=0.0, attention_dropout=0.0, residual_dropout=0.0)


def canonical_shapes(arch: DecoderArch) -> dict[str, tuple[int, ...]]:
    """Every parameter's canonical name and portable shape (HF's layout, `kernel_layout`), in a fixed order."""
    hidden, inner, heads = arch.hidden_size, arch.intermediate_size, arch.num_heads * arch.head_dim
    kv = arch.num_kv_heads * arch.head_dim

    def linear(module: str, into: int, out: int, bias: bool) -> dict[str, tuple[int, ...]]:
        weight = (into, out) if arch.kernel_layout == "in_out" else (out, into)
        return {f"{module}.weight": weight, **({f"{module}.bias": (out,)} if bias else {})}

    def norm(module: str) -> dict[str, tuple[int, ...]]:
        return {f"{module}.weight": (hidden,), **({f"{module}.bias": (hidden,)} if arch.norm_bias else {})}

    shapes: dict[str, tuple[int, ...]] = {"embeddings.word.weight": (arch.vocab_size, hidden)}
    if arch.rope is None:
        shapes["embeddings.position.weight"] = (arch.max_positions, hidden)
    for block in range(arch.num_layers):
        prefix = f"block.{block}"
        shapes |= norm(f"{prefix}.attention_norm")
        if arch.fused_qkv:
            shapes |= linear(f"{prefix}.qkv", hidden, heads + 2 * kv, arch.qkv_bias)
        else:
            shapes |= linear(f"{prefix}.query", hidden, heads, arch.qkv_bias)
            shapes |= linear(f"{prefix}.key", hidden, kv, arch.qkv_bias)
            shapes |= linear(f"{prefix}.value", hidden, kv, arch.qkv_bias)
        shapes |= linear(f"{prefix}.attention_output", heads, hidden, arch.output_bias)
        if arch.post_norms:
            shapes |= norm(f"{prefix}.attention_post_norm")
        shapes |= norm(f"{prefix}.mlp_norm")
        if arch.fused_gate_up:
            shapes |= linear(f"{prefix}.gate_up", hidden, 2 * inner, arch.mlp_bias)
        else:
            if arch.gated_mlp:
                shapes |= linear(f"{prefix}.gate", hidden, inner, arch.mlp_bias)
            shapes |= linear(f"{prefix}.up", hidden, inner, arch.mlp_bias)
        shapes |= linear(f"{prefix}.down", inner, hidden, arch.mlp_bias)
        if arch.post_norms:
            shapes |= norm(f"{prefix}.mlp_post_norm")
    shapes |= norm("final_norm")
    if not arch.tied:
        shapes["lm_head.weight"] = (arch.vocab_size, hidden)  # an Embedding-shaped [V, H] in both layouts
    return shapes


RESIDUAL_OUTPUTS = ("attention_output", "down")
"""The projections back into the residual stream (drawn smaller under `scaled_output_init`)."""


def initial_params(arch: DecoderArch, seed: int) -> dict[str, SliceReader]:
    """Every parameter as HF initialises the family, float32 (`drawn_as_hf`): weights and embeddings from
    N(0, initializer_range) (residual projections / sqrt(2 * layers) under `scaled_output_init`), biases 0, norms 1
    (0 where the norm scales by 1 + weight, as Gemma's `_init_weights` zeroes them)."""
    residual_std = arch.initializer_range / math.sqrt(2 * arch.num_layers)

    def std(module: str) -> float:
        scaled = arch.scaled_output_init and module.rsplit(".", 1)[-1] in RESIDUAL_OUTPUTS
        return residual_std if scaled else arch.initializer_range

    params = drawn_as_hf(canonical_shapes(arch), seed, std)
    if arch.norm_offset:
        params |= {name: np.zeros(np.shape(array), np.float32) for name, array in params.items()
                   if name.rsplit(".", 1)[0].endswith("norm")}
    return params


def rotary(ops: Ops, x: Any, positions: Any, rope: Rope) -> Any:
    """HF Llama's rotary embedding of x [B, T, heads, D] at positions int [B, T] (halves rotated, not pairs) with
    `rope`'s inverse frequencies: the angles, and the cosines and sines scaled by its attention factor, in float32,
    the rotation in x's dtype; the dimensions past `rope.rotated` (Phi-3's partial rotation) pass through."""
    half = rope.rotated // 2
    angles = ops.float32(positions)[..., None] * rope.inverse_frequencies(ops, positions)  # [B, T, D/2]
    scale = np.float32(rope.attention_factor)
    cos, sin = (ops.cast_like(f(angles) * scale if scale != 1 else f(angles), x)[:, :, None, :]
                for f in (ops.cos, ops.sin))
    first, second = x[..., :half], x[..., half:rope.rotated]
    rotated = [first * cos - second * sin, second * cos + first * sin]
    return ops.concat(rotated if rope.rotated == ops.shape(x)[-1] else [*rotated, x[..., rope.rotated:]], axis=-1)


def attention_mask(ops: Ops, length: int, keys: Any, cache_index: Any, key_mask: Any | None, window: int) -> Any:
    """bool [B or 1, T, S]: what each of `length` queries (at cache_index..) sees of `keys` key positions: the keys
    at or before it, within `window` of it (0: all of them), that key_mask [B, S] keeps."""
    query_at, key_at = cache_index + ops.arange(length), ops.arange(keys)
    sees = key_at[None, :] <= query_at[:, None]
    if window:
        sees = sees & (key_at[None, :] > query_at[:, None] - window)
    sees = sees[None]
    return sees if key_mask is None else sees & (key_mask[:, None, :] > 0)


def soft_cap(ops: Ops, x: Any, cap: float) -> Any:
    return ops.tanh(x / cap) * cap if cap else x


Cache = tuple[tuple[Any, Any], ...]
"""Each layer's (keys, values), [B, S, kv_heads, head_dim]."""


def forward(ops: Ops, p: Mapping[str, Any], arch: DecoderArch, input_ids: Any, *, lora: Any = None,
            positions: Any = None, cache: Cache | None = None, cache_index: Any = 0, key_mask: Any = None,
            target_positions: Any = None, layer: Callable[..., tuple[Any, Any]] | None = None) -> Any:
    """Next-token logits float32 [B, T, V] of input_ids int [B, T]; with target_positions int [B, K], those
    positions' alone, [B, K, V] (a chat batch's answer targets: the final norm and the LM head, a large share of
    the work of a short row, run on them only).

    Training passes the ids alone (positions 0..T-1, causal attention). Decoding passes `positions` int [B, T],
    `key_mask` [B, S] (0 on the prompts' left padding) and a `cache` (each layer's keys and values over S
    positions, written from `cache_index`), and gets (logits, the updated cache).
    p: canonical name -> parameter (the framework's tensors, portable layout). lora: the run's `Lora` or None.
    layer(index, x, positions, masks, cache_entry, cache_index) -> (x, entry): how a framework runs one block
    (torch calls it as a module, so FSDP2 gathers its weights first); `block` over `p` by default.
    """
    length = ops.shape(input_ids)[1]
    if positions is None:
        positions = ops.arange(length)[None, :]  # [1, T]: one row of positions serves every row
    x = ops.embed(p["embeddings.word.weight"], input_ids)
    if arch.rope is None:
        x = x + ops.embed(p["embeddings.position.weight"], positions)
    if arch.embedding_scale != 1.0:
        x = x * ops.cast_like(ops.constant(np.float32(arch.embedding_scale)), x)
    x = ops.dropout(x, arch.embedding_dropout, 0)
    keys = length if cache is None else ops.shape(cache[0][0])[1]
    # Plain causal attention over the rows (training: no cache, no key mask, no window) is what the fused kernels
    # do without reading a mask.
    masks = {window: (attention_mask(ops, length, keys, cache_index, key_mask, window),
                      cache is None and key_mask is None and not window)
             for window in {arch.window(index) for index in range(arch.num_layers)}}
    run = layer or (lambda index, *args: block(ops, p, arch, lora, index, *args))
    updated = []
    for index in range(arch.num_layers):
        x, entry = run(index, x, positions, masks, None if cache is None else cache[index], cache_index)
        updated.append(entry)
    if target_positions is not None:
        x = ops.take(x, target_positions)
    x = norm(ops, p, arch, "final_norm", x)
    logits = ops.float32(ops.linear(x, p["embeddings.word.weight" if arch.tied else "lm_head.weight"], None))
    logits = soft_cap(ops, logits, arch.logit_softcap)
    return logits if cache is None else (logits, tuple(updated))


DROPOUT_SITES = 3
"""Dropout sites per block (attention probabilities, the attention's and the MLP's outputs), after the
embeddings' site 0; LoRA's dropout draws at sites of its own (negative), so the base's masks do not move."""


def block(ops: Ops, p: Mapping[str, Any], arch: DecoderArch, lora: Any, index: int, x: Any, positions: Any,
          masks: Mapping[int, Any], cache: tuple[Any, Any] | None, cache_index: Any) -> tuple[Any, Any]:
    """One pre-norm block: x [B, T, H] -> ([B, T, H], its updated cache entry or None). masks: window -> (what
    `attention_mask` gives for it, whether that is plain causal attention over the rows)."""
    rows, length = ops.shape(x)[:2]
    heads, kv, size = arch.num_heads, arch.num_kv_heads, arch.head_dim
    name, site = f"block.{index}", 1 + DROPOUT_SITES * index

    def project(module: str, h: Any) -> Any:
        return projection(ops, p, arch, lora, f"{name}.{module}", h)

    h = norm(ops, p, arch, f"{name}.attention_norm", x)
    if arch.fused_qkv:
        query, key, value = ops.split(project("qkv", h), [heads * size, kv * size, kv * size])
    else:
        query, key, value = (project(part, h) for part in ("query", "key", "value"))
    query = ops.reshape(query, (rows, length, heads, size))
    key, value = (ops.reshape(t, (rows, length, kv, size)) for t in (key, value))
    if arch.rope is not None:
        query, key = rotary(ops, query, positions, arch.rope), rotary(ops, key, positions, arch.rope)
    if cache is not None:
        key, value = ops.cache_write(cache[0], key, cache_index), ops.cache_write(cache[1], value, cache_index)
        cache = (key, value)
    mask, causal = masks[arch.window(index)]
    context = ops.attention(query, key, value, mask, causal, arch.scale, arch.attention_softcap,
                            arch.attention_dropout, site)
    attended = project("attention_output", ops.reshape(context, (rows, length, heads * size)))
    if arch.post_norms:
        attended = norm(ops, p, arch, f"{name}.attention_post_norm", attended)
    x = x + ops.dropout(attended, arch.residual_dropout, site + 1)
    h = norm(ops, p, arch, f"{name}.mlp_norm", x)
    if arch.fused_gate_up:
        gate, up = ops.split(project("gate_up", h), [arch.intermediate_size] * 2)
        inner = ops.activation(arch.activation, gate) * up
    elif arch.gated_mlp:
        inner = ops.activation(arch.activation, project("gate", h)) * project("up", h)
    else:
        inner = ops.activation(arch.activation, project("up", h))
    out = project("down", inner)
    if arch.post_norms:
        out = norm(ops, p, arch, f"{name}.mlp_post_norm", out)
    return x + ops.dropout(out, arch.residual_dropout, site + 2), cache


PROJECTIONS = ("qkv", "query", "key", "value", "attention_output", "gate", "up", "down", "gate_up")
"""The canonical projections of a decoder block an adapter may sit on (their order numbers LoRA's dropout
sites)."""


def projection(ops: Ops, p: Mapping[str, Any], arch: DecoderArch, lora: Any, module: str, x: Any) -> Any:
    """The projection `module` (`block.3.query`) of x [..., in] -> [..., out], with its LoRA adapter when it has one:
    + scale * B A dropout(x), A [rank, in] and B [out, rank] in torch's layout in every family."""
    y = ops.linear(x, p[f"{module}.weight"], p.get(f"{module}.bias"), arch.kernel_layout == "in_out")
    if lora is None or not lora.adapts(module):
        return y
    _, index, leaf = module.split(".")
    site = -(1 + int(index) * len(PROJECTIONS) + PROJECTIONS.index(leaf))
    low = ops.linear(ops.dropout(x, lora.dropout, site), p[f"{module}.lora_A.weight"], None)
    return y + ops.linear(low, p[f"{module}.lora_B.weight"], None) * lora.scale


def norm(ops: Ops, p: Mapping[str, Any], arch: DecoderArch, module: str, x: Any) -> Any:
    if arch.rms_norm:
        return ops.rms_norm(x, p[f"{module}.weight"], arch.norm_eps, arch.norm_offset)
    return ops.layer_norm(x, p[f"{module}.weight"], p.get(f"{module}.bias"), arch.norm_eps)


TENSOR_ROLES = MappingProxyType({"query": "column", "key": "column", "value": "column", "qkv": "column",
                                 "gate": "column", "up": "column", "gate_up": "column",
                                 "attention_output": "row", "down": "row"})
"""Each block projection's tensor-parallel role (`tpuplex.sharding.TENSOR_ROLES`), over canonical names."""


@dataclasses.dataclass(frozen=True)
class DecoderFamily:
    """One decoder family.

    model_types: config.json's `model_type` values (the first is its name); hf_class: its `*ForCausalLM`;
    hf_biased: that class always has the biases (GPT-2), so a bias-free model is exported with zero ones.
    modules: canonical module -> HF module; block modules are templates over `block`.
    read: config.json -> DecoderArch.
    peft_targets: PEFT's default `target_modules` for the family (`[model.lora] targets` when not given), or
    None where PEFT has none (the user names them).
    tensor_roles: canonical block projection -> its tensor-parallel role (`TENSOR_ROLES` by default).
    """

    model_types: tuple[str, ...]
    hf_class: str
    modules: Mapping[str, str]
    read: Callable[[ConfigReader], DecoderArch]
    peft_targets: tuple[str, ...] | None
    hf_biased: bool = False
    tensor_roles: Mapping[str, str] = dataclasses.field(default_factory=lambda: TENSOR_ROLES)

    @property
    def name(self) -> str:
        return self.model_types[0]

    def architecture(self, hf_config: Mapping[str, Any], path: Path | str = "config.json") -> DecoderArch:
        reader = ConfigReader(hf_config, path)
        arch = self.read(reader)
        if arch.activation not in DECODER_ACTIVATIONS:
            raise TpuplexError(f"the activation {arch.activation!r} in {path} is not supported: tpuplex implements "
                               f"{', '.join(DECODER_ACTIVATIONS)}")
        if arch.num_heads % arch.num_kv_heads:
            raise TpuplexError(f"{path}: {arch.num_heads} attention heads do not divide into {arch.num_kv_heads} "
                               "key/value heads: fix the checkpoint's config.json")
        return arch

    def hf_name(self, canonical: str) -> str:
        """`block.3.query.weight` -> e.g. `model.layers.3.self_attn.q_proj.weight`."""
        module, leaf = canonical.rsplit(".", 1)
        if module.startswith("block."):
            _, index, module = module.split(".", 2)
            return f"{self.modules[f'block.{module}'].format(block=index)}.{leaf}"
        return f"{self.modules[module]}.{leaf}"

    def hf_names(self, arch: DecoderArch) -> dict[str, str]:
        """Canonical name -> HF name of every parameter."""
        return {name: self.hf_name(name) for name in canonical_shapes(arch)}

    def hf_shapes(self, arch: DecoderArch) -> dict[str, tuple[int, ...]]:
        """HF name -> portable shape of every parameter."""
        return {self.hf_name(name): shape for name, shape in canonical_shapes(arch).items()}

    def hf_weights(self, arch: DecoderArch, params: Mapping[str, SliceReader]) -> dict[str, SliceReader]:
        """`params` (HF names) with the biases the family's HF class always has and `arch` lacks (nanoGPT's
        bias = False) as zeros: the same model, as `from_pretrained` reads it."""
        if not self.hf_biased:
            return dict(params)
        biased = dataclasses.replace(arch, qkv_bias=True, output_bias=True, mlp_bias=True, norm_bias=True)
        return {**params, **{name: np.zeros(shape, np.float32) for name, shape in self.hf_shapes(biased).items()
                             if name not in params}}

    def tensor_dims(self, arch: DecoderArch) -> dict[str, int]:
        """HF name -> the dimension of the portable weight its tensor-parallel role splits: a "column" projection
        its outputs, a "row" one its inputs, in the family's kernel layout."""
        outputs = 1 if arch.kernel_layout == "in_out" else 0
        dims = {}
        for name in canonical_shapes(arch):
            module, leaf = name.rsplit(".", 1)
            role = self.tensor_roles.get(module.rsplit(".", 1)[-1]) if module.startswith("block.") else None
            if leaf == "weight" and role:
                dims[self.hf_name(name)] = outputs if role == "column" else 1 - outputs
        return dims

    def tied_names(self, arch: DecoderArch) -> dict[str, str]:
        """HF's tied alias -> the parameter it is (the LM head of a tied model)."""
        return {self.modules["lm_head"] + ".weight": self.hf_name("embeddings.word.weight")} if arch.tied else {}

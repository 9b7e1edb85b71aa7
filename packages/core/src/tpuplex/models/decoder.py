"""A decoder language model's architecture in one framework-free form, shared by the decoder families and backends.

GPT-2 and Llama are the same network up to a few switches:

    embeddings   word [+ learned position] -> dropout
    blocks       pre-norm:  x += attention(norm(x));  x += mlp(norm(x))
                 attention: causal, grouped-query (kv heads <= heads), [rotary positions], fused or separate q/k/v
                 mlp:       down(act(up(x)))  or, gated,  down(act(gate(x)) * up(x))
    final norm -> LM head (tied to the word embeddings, or its own)

Parameters have canonical names (`embeddings.word.weight`, `block.3.query.weight`, `lm_head.weight`, ...), which a
`DecoderFamily` maps to the HF names its checkpoints use. Their portable layout is HF's: Llama's Linear weights
[out, in], GPT-2's Conv1D weights [in, out] (`kernel_layout`), so a portable checkpoint is a `from_pretrained`
state dict as it is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tpuplex import flops
from tpuplex.errors import TpuplexError
from tpuplex.models.architecture import drawn_as_hf
from tpuplex.models.family import ConfigReader
from tpuplex.slices import SliceReader

DECODER_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu")
"""Activation names (HF's spelling) every backend implements for decoders; "gelu" is the exact erf form."""


@dataclasses.dataclass(frozen=True)
class DecoderArch:
    """Sizes and switches of one decoder, read from an HF `config.json` by its `DecoderFamily`.

    num_kv_heads: key/value heads (grouped-query attention; = num_heads without it); head_dim: per head.
    rope_theta: rotary positions' base (0: learned position embeddings of `max_positions` rows instead).
    rms_norm: RMSNorm (weight only) rather than LayerNorm; norm_bias: the LayerNorms have a bias.
    fused_qkv: one projection to [q | k | v] (GPT-2's c_attn) rather than three.
    gated_mlp: down(act(gate(x)) * up(x)) (SwiGLU) rather than down(act(up(x))).
    kernel_layout: "in_out" (GPT-2's Conv1D, [in, out]) or "out_in" (torch Linear, [out, in]).
    tied: the LM head is the word embedding table.
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
    rope_theta: float
    rms_norm: bool
    norm_bias: bool
    norm_eps: float
    activation: str
    fused_qkv: bool
    gated_mlp: bool
    attention_bias: bool
    mlp_bias: bool
    kernel_layout: str
    tied: bool
    embedding_dropout: float
    attention_dropout: float
    residual_dropout: float
    initializer_range: float
    scaled_output_init: bool

    @property
    def max_length(self) -> int:
        """The longest sequence the model takes (its position table, or the configured context for rotary)."""
        return self.max_positions

    def forward_flops(self, rows: int, length: int) -> float:
        """Forward FLOPs over [rows, length] tokens (`tpuplex.flops`): every layer's projections (grouped keys and
        values at their own width) and attention, and the LM head over the vocabulary."""
        hidden, heads, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        mlp = (3 if self.gated_mlp else 2) * hidden * self.intermediate_size
        layer = flops.transformer_layer_flops(rows, length, heads, 2 * hidden * heads + 2 * hidden * kv + mlp)
        return self.num_layers * layer + 2.0 * rows * length * hidden * self.vocab_size

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
    if not arch.rope_theta:
        shapes["embeddings.position.weight"] = (arch.max_positions, hidden)
    for block in range(arch.num_layers):
        prefix = f"block.{block}"
        shapes |= norm(f"{prefix}.attention_norm")
        if arch.fused_qkv:
            shapes |= linear(f"{prefix}.qkv", hidden, heads + 2 * kv, arch.attention_bias)
        else:
            shapes |= linear(f"{prefix}.query", hidden, heads, arch.attention_bias)
            shapes |= linear(f"{prefix}.key", hidden, kv, arch.attention_bias)
            shapes |= linear(f"{prefix}.value", hidden, kv, arch.attention_bias)
        shapes |= linear(f"{prefix}.attention_output", heads, hidden, arch.attention_bias)
        shapes |= norm(f"{prefix}.mlp_norm")
        if arch.gated_mlp:
            shapes |= linear(f"{prefix}.gate", hidden, inner, arch.mlp_bias)
        shapes |= linear(f"{prefix}.up", hidden, inner, arch.mlp_bias)
        shapes |= linear(f"{prefix}.down", inner, hidden, arch.mlp_bias)
    shapes |= norm("final_norm")
    if not arch.tied:
        shapes["lm_head.weight"] = (arch.vocab_size, hidden)  # an Embedding-shaped [V, H] in both layouts
    return shapes


RESIDUAL_OUTPUTS = ("attention_output", "down")
"""The projections back into the residual stream (drawn smaller under `scaled_output_init`)."""


def initial_params(arch: DecoderArch, seed: int) -> dict[str, SliceReader]:
    """Every parameter as HF initialises the family, float32 (`drawn_as_hf`): weights and embeddings from
    N(0, initializer_range) (residual projections / sqrt(2 * layers) under `scaled_output_init`), biases 0,
    norms 1."""
    residual_std = arch.initializer_range / math.sqrt(2 * arch.num_layers)

    def std(module: str) -> float:
        scaled = arch.scaled_output_init and module.rsplit(".", 1)[-1] in RESIDUAL_OUTPUTS
        return residual_std if scaled else arch.initializer_range

    return drawn_as_hf(canonical_shapes(arch), seed, std)


@dataclasses.dataclass(frozen=True)
class DecoderFamily:
    """One decoder family.

    model_types: config.json's `model_type` values (the first is its name); hf_class: its `*ForCausalLM`;
    hf_biased: that class always has the biases (GPT-2), so a bias-free model is exported with zero ones.
    modules: canonical module -> HF module; block modules are templates over `block`.
    read: config.json -> DecoderArch.
    """

    model_types: tuple[str, ...]
    hf_class: str
    modules: Mapping[str, str]
    read: Callable[[ConfigReader], DecoderArch]
    hf_biased: bool = False

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
        if arch.rope_theta and arch.head_dim % 2:
            raise TpuplexError(f"{path}: rotary positions need an even head size, not {arch.head_dim}: fix the "
                               "checkpoint's config.json")
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
        biased = dataclasses.replace(arch, attention_bias=True, mlp_bias=True, norm_bias=True)
        return {**params, **{name: np.zeros(shape, np.float32) for name, shape in self.hf_shapes(biased).items()
                             if name not in params}}

    def tied_names(self, arch: DecoderArch) -> dict[str, str]:
        """HF's tied alias -> the parameter it is (the LM head of a tied model)."""
        return {self.modules["lm_head"] + ".weight": self.hf_name("embeddings.word.weight")} if arch.tied else {}

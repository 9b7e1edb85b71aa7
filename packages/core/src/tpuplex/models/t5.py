"""T5 (`T5ForConditionalGeneration`: T5 v1.0, v1.1 and mT5): an encoder-decoder written once over the operations
each framework gives (`tpuplex.models.ops.Ops`), as the decoders are (`tpuplex.models.decoder`):

    encoder   word embeddings -> dropout -> blocks -> final RMSNorm -> dropout
              block: x += attention(norm(x)) with a relative position bias, bidirectional;  x += mlp(norm(x))
    decoder   word embeddings -> dropout -> blocks -> final RMSNorm -> dropout [* hidden ** -0.5 (v1.0)]
              block: x += causal attention(norm(x)) with a one-way position bias;
                     x += attention of norm(x) over the encoder's outputs;  x += mlp(norm(x))
    LM head   the word embeddings (tied, v1.0) or its own (v1.1)

    mlp: down(relu(up(x))) (v1.0) or down(gelu_new(gate(x)) * up(x)) (v1.1's gated GELU)

T5's norms are RMSNorms without a bias; its projections have no biases; its attention does not scale the scores
(Mesh TensorFlow folded 1 / sqrt(head_dim) into the query's initialisation). Each stack's first block owns a table
of learned biases, one per (relative position bucket, head), which every block of the stack adds to its scores.

Parameters have canonical names (`encoder.block.0.self_attention.query.weight`, `decoder.position_bias.weight`, ...)
that `T5Family.hf_name` maps to HF's, in HF's layout (a Linear [out, in]), so a portable checkpoint is a
`from_pretrained` state dict as it is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from tpuplex import flops
from tpuplex.errors import TpuplexError
from tpuplex.initializers import drawn_as_hf
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.decoder import attention_mask
from tpuplex.models.ops import Ops
from tpuplex.slices import SliceReader

ACTIVATIONS = ("relu", "gelu_new", "gelu")
"""The dense activations (`feed_forward_proj`, "gated-" or not) every backend implements for T5."""


@dataclasses.dataclass(frozen=True)
class T5Arch:
    """Sizes and switches of one T5, read from an HF `config.json` (`T5Config`).

    head_dim: `d_kv` (T5's heads need not divide the hidden size); buckets, max_distance: the relative positions'
    `relative_attention_num_buckets` and `relative_attention_max_distance`; gated_mlp: `feed_forward_proj` =
    "gated-*" (v1.1); tied: the LM head is the word embeddings; scaled_outputs: the decoder's outputs are scaled by
    hidden ** -0.5 before the LM head (v1.0; `scale_decoder_outputs` in the config.json of transformers 5, which
    always ties, else whether the head is tied); initializer_factor: HF's scale of every initial std.
    """

    family: str
    vocab_size: int
    hidden_size: int
    head_dim: int
    num_heads: int
    intermediate_size: int
    encoder_layers: int
    decoder_layers: int
    buckets: int
    max_distance: int
    gated_mlp: bool
    activation: str
    norm_eps: float
    dropout: float
    tied: bool
    scaled_outputs: bool
    initializer_factor: float
    pad_id: int
    eos_id: int
    decoder_start_id: int

    @property
    def max_length(self) -> int:
        """No limit of its own: relative positions reach any length (beyond max_distance they share a bucket)."""
        return np.iinfo(np.int32).max

    def forward_flops(self, rows: int, source: int, target: int) -> float:
        """Forward FLOPs over [rows, source] inputs and [rows, target] targets (`tpuplex.flops`): each encoder layer
        over the source, each decoder layer's self-attention over the target and cross-attention over the source,
        and the LM head."""
        hidden, inner = self.hidden_size, self.num_heads * self.head_dim
        mlp = (3 if self.gated_mlp else 2) * hidden * self.intermediate_size
        attention = 4 * hidden * inner
        encoder = self.encoder_layers * flops.transformer_layer_flops(rows, source, inner, attention + mlp)
        decoder = self.decoder_layers * (flops.transformer_layer_flops(rows, target, inner, attention + mlp)
                                         + 2.0 * rows * (target + source) * 2 * hidden * inner
                                         + 4.0 * rows * target * source * inner)
        return encoder + decoder + 2.0 * rows * target * hidden * self.vocab_size

    def without_dropout(self) -> T5Arch:
        return dataclasses.replace(self, dropout=0.0)


def read(config: ConfigReader) -> T5Arch:
    proj = config.get("feed_forward_proj", str, "relu")
    gated = proj.startswith("gated-")
    activation = "gelu_new" if proj == "gated-gelu" else proj.removeprefix("gated-")
    if activation not in ACTIVATIONS:
        raise TpuplexError(f"feed_forward_proj = {proj!r} in {config.path} is not supported: tpuplex implements "
                           f"{', '.join(ACTIVATIONS)} and their gated-* forms")
    layers = config.layers("num_layers")
    tied = config.get("tie_word_embeddings", bool, True)
    return T5Arch(
        family="t5", vocab_size=config.get("vocab_size", int, 0), hidden_size=config.positive("d_model"),
        head_dim=config.positive("d_kv"), num_heads=config.positive("num_heads"),
        intermediate_size=config.positive("d_ff"), encoder_layers=layers,
        decoder_layers=config.get("num_decoder_layers", int, None) or layers,
        buckets=config.positive("relative_attention_num_buckets", 32),
        max_distance=config.positive("relative_attention_max_distance", 128), gated_mlp=gated,
        activation=activation, norm_eps=config.get("layer_norm_epsilon", float, 1e-6),
        dropout=config.get("dropout_rate", float, 0.1), tied=tied,
        scaled_outputs=config.get("scale_decoder_outputs", bool, tied),
        initializer_factor=config.get("initializer_factor", float, 1.0),
        pad_id=config.get("pad_token_id", int, 0), eos_id=config.get("eos_token_id", int, 1),
        decoder_start_id=config.get("decoder_start_token_id", int, 0))


INPUTS = ("input_ids", "attention_mask", "decoder_input_ids")
"""What the model is called with, in order: the inputs and their mask [B, S], the decoder's inputs [B, T]."""
STACKS = ("encoder", "decoder")
ATTENTION_PROJECTIONS = ("query", "key", "value", "output")


def canonical_shapes(arch: T5Arch) -> dict[str, tuple[int, ...]]:
    """Every parameter's canonical name and portable shape (HF's: a Linear [out, in]), in a fixed order."""
    hidden, inner, ff = arch.hidden_size, arch.num_heads * arch.head_dim, arch.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"embeddings.word.weight": (arch.vocab_size, hidden)}

    def attention(module: str) -> None:
        shapes.update({f"{module}.{part}.weight": (inner, hidden) for part in ("query", "key", "value")})
        shapes[f"{module}.output.weight"] = (hidden, inner)

    for stack, layers in zip(STACKS, (arch.encoder_layers, arch.decoder_layers), strict=True):
        shapes[f"{stack}.position_bias.weight"] = (arch.buckets, arch.num_heads)
        for index in range(layers):
            block = f"{stack}.block.{index}"
            shapes[f"{block}.attention_norm.weight"] = (hidden,)
            attention(f"{block}.self_attention")
            if stack == "decoder":
                shapes[f"{block}.cross_attention_norm.weight"] = (hidden,)
                attention(f"{block}.cross_attention")
            shapes[f"{block}.mlp_norm.weight"] = (hidden,)
            if arch.gated_mlp:
                shapes[f"{block}.gate.weight"] = (ff, hidden)
            shapes[f"{block}.up.weight"] = (ff, hidden)
            shapes[f"{block}.down.weight"] = (hidden, ff)
        shapes[f"{stack}.final_norm.weight"] = (hidden,)
    if not arch.tied:
        shapes["lm_head.weight"] = (arch.vocab_size, hidden)
    return shapes


def initial_params(arch: T5Arch, seed: int) -> dict[str, SliceReader]:
    """Every parameter as HF's `T5PreTrainedModel._init_weights` draws it, float32 (`drawn_as_hf`): embeddings and
    the LM head N(0, 1); a query N(0, (hidden * head_dim) ** -0.5), keys and values N(0, hidden ** -0.5), the
    attention's output N(0, inner ** -0.5); gate and up N(0, hidden ** -0.5), down N(0, d_ff ** -0.5); the position
    biases N(0, hidden ** -0.5); norms 1; each times `initializer_factor`."""
    hidden, inner = arch.hidden_size, arch.num_heads * arch.head_dim
    stds = {"word": 1.0, "lm_head": 1.0, "query": (hidden * arch.head_dim) ** -0.5, "key": hidden ** -0.5,
            "value": hidden ** -0.5, "output": inner ** -0.5, "gate": hidden ** -0.5, "up": hidden ** -0.5,
            "down": arch.intermediate_size ** -0.5, "position_bias": hidden ** -0.5}
    return drawn_as_hf(canonical_shapes(arch), seed,
                       lambda module: arch.initializer_factor * stds[module.rsplit(".", 1)[-1]])


def relative_buckets(distances: np.ndarray, bidirectional: bool, buckets: int, max_distance: int) -> np.ndarray:
    """int32 buckets of key - query distances, as Mesh TensorFlow's `_relative_position_bucket` (HF's): half the
    buckets (per direction, when bidirectional) exact for small distances, the rest logarithmic up to
    max_distance, in float32 as HF computes them."""
    result = np.zeros(distances.shape, np.int32)
    if bidirectional:
        buckets //= 2
        result += (distances > 0).astype(np.int32) * buckets
        distances = np.abs(distances)
    else:
        distances = -np.minimum(distances, 0)
    exact = buckets // 2
    scaled = (np.log(np.maximum(distances, 1).astype(np.float32) / np.float32(exact))
              / np.float32(math.log(max_distance / exact)) * np.float32(buckets - exact))
    large = np.minimum(exact + scaled.astype(np.int32), buckets - 1)
    return result + np.where(distances < exact, distances, large).astype(np.int32)


def position_bias(ops: Ops, table: Any, queries: int, keys: int, query_start: Any, bidirectional: bool,
                  arch: T5Arch) -> Any:
    """[1, heads, T, S]: the learned bias table [buckets, heads]'s entry for each of `queries` queries (at
    query_start..) and `keys` keys. Each distance's row is gathered once ([2S - 1, heads]), then each (query, key)
    pair's, so a traced query_start (decoding from a cache) needs no bucket arithmetic in the framework."""
    distances = np.arange(-(keys - 1), keys)
    by_distance = ops.embed(table, ops.constant(relative_buckets(distances, bidirectional, arch.buckets,
                                                                 arch.max_distance)))
    query_at = query_start + ops.arange(queries)
    pairs = ops.arange(keys)[None, :] - query_at[:, None] + (keys - 1)  # [T, S]: key - query, from 0
    return ops.transpose(ops.embed(by_distance, pairs), (2, 0, 1))[None]


DROPOUT_SITES = 4
"""Dropout sites per block (attention probabilities, the attention's output, the MLP's inner activations and its
output), after each stack's site for its embeddings; a decoder block's cross-attention takes two more."""


def _site(stack: str, arch: T5Arch, index: int) -> int:
    """The first dropout site of block `index` of `stack`: the encoder's from 1, the decoder's after the encoder's
    and its final dropout."""
    first = 1 if stack == "encoder" else 3 + DROPOUT_SITES * arch.encoder_layers
    return first + (DROPOUT_SITES + (2 if stack == "decoder" else 0)) * index


def norm(ops: Ops, p: Mapping[str, Any], arch: T5Arch, module: str, x: Any) -> Any:
    return ops.rms_norm(x, p[f"{module}.weight"], arch.norm_eps)


def attend(ops: Ops, p: Mapping[str, Any], arch: T5Arch, module: str, query_input: Any, keys: Any, values: Any,
           mask: Any, causal: bool, bias: Any | None, site: int) -> Any:
    """The output [B, T, H] of attention `module` (`decoder.block.0.cross_attention`): its query of
    query_input [B, T, H] over keys and values [B, S, heads, D], unscaled, with `bias` [1, heads, T, S] or None."""
    rows, length = ops.shape(query_input)[:2]
    query = ops.reshape(ops.linear(query_input, p[f"{module}.query.weight"], None),
                        (rows, length, arch.num_heads, arch.head_dim))
    context = ops.attention(query, keys, values, mask, causal, 1.0, 0.0, arch.dropout, site, bias=bias)
    return ops.linear(ops.reshape(context, (rows, length, arch.num_heads * arch.head_dim)),
                      p[f"{module}.output.weight"], None)


def keys_values(ops: Ops, p: Mapping[str, Any], arch: T5Arch, module: str, x: Any) -> tuple[Any, Any]:
    """Attention `module`'s keys and values [B, S, heads, D] of x [B, S, H]."""
    rows, length = ops.shape(x)[:2]
    return tuple(ops.reshape(ops.linear(x, p[f"{module}.{part}.weight"], None),
                             (rows, length, arch.num_heads, arch.head_dim)) for part in ("key", "value"))


def mlp(ops: Ops, p: Mapping[str, Any], arch: T5Arch, block: str, x: Any, site: int) -> Any:
    up = ops.linear(x, p[f"{block}.up.weight"], None)
    if arch.gated_mlp:
        inner = ops.activation(arch.activation, ops.linear(x, p[f"{block}.gate.weight"], None)) * up
    else:
        inner = ops.activation(arch.activation, up)
    return ops.linear(ops.dropout(inner, arch.dropout, site), p[f"{block}.down.weight"], None)


def encode(ops: Ops, p: Mapping[str, Any], arch: T5Arch, input_ids: Any, attention_mask: Any) -> Any:
    """The encoder's outputs [B, S, H] of input_ids int [B, S], attention_mask [B, S] (0 on padding)."""
    length = ops.shape(input_ids)[1]
    x = ops.dropout(ops.embed(p["embeddings.word.weight"], input_ids), arch.dropout, 0)
    mask = (attention_mask > 0)[:, None, :]  # [B, 1, S]: every query sees the row's real keys
    bias = position_bias(ops, p["encoder.position_bias.weight"], length, length, 0, True, arch)
    for index in range(arch.encoder_layers):
        block, site = f"encoder.block.{index}", _site("encoder", arch, index)
        h = norm(ops, p, arch, f"{block}.attention_norm", x)
        keys, values = keys_values(ops, p, arch, f"{block}.self_attention", h)
        attended = attend(ops, p, arch, f"{block}.self_attention", h, keys, values, mask, False, bias, site)
        x = x + ops.dropout(attended, arch.dropout, site + 1)
        x = x + ops.dropout(mlp(ops, p, arch, block, norm(ops, p, arch, f"{block}.mlp_norm", x), site + 2),
                            arch.dropout, site + 3)
    return ops.dropout(norm(ops, p, arch, "encoder.final_norm", x), arch.dropout, _site("encoder", arch,
                                                                                        arch.encoder_layers))


Cache = tuple[tuple[Any, Any], ...]
"""Each decoder layer's (keys, values), [B, S, heads, head_dim]: its self-attention's cache, or its
cross-attention's keys and values of the encoder's outputs (`cross_keys`)."""


def cross_keys(ops: Ops, p: Mapping[str, Any], arch: T5Arch, encoded: Any) -> Cache:
    """Every decoder layer's cross-attention keys and values of the encoder's outputs [B, S, H], computed once
    for a whole decoding."""
    return tuple(keys_values(ops, p, arch, f"decoder.block.{index}.cross_attention", encoded)
                 for index in range(arch.decoder_layers))


def decode(ops: Ops, p: Mapping[str, Any], arch: T5Arch, decoder_input_ids: Any, encoded: Any, encoder_mask: Any,
           *, cross: Cache | None = None, cache: Cache | None = None, cache_index: Any = 0) -> Any:
    """Next-token logits float32 [B, T, V] of decoder_input_ids int [B, T] (the targets shifted right behind
    `decoder_start_id`) given the encoder's outputs [B, S, H] and its mask [B, S].

    Decoding passes `cross` (`cross_keys`, so `encoded` is not read) and a `cache` (each layer's self-attention
    keys and values over its positions, written from `cache_index`), and gets (logits, the updated cache).
    """
    length = ops.shape(decoder_input_ids)[1]
    keys = length if cache is None else ops.shape(cache[0][0])[1]
    if cross is None:
        cross = cross_keys(ops, p, arch, encoded)
    x = ops.dropout(ops.embed(p["embeddings.word.weight"], decoder_input_ids), arch.dropout,
                    _site("encoder", arch, arch.encoder_layers) + 1)
    causal = attention_mask(ops, length, keys, cache_index, None, 0)
    bias = position_bias(ops, p["decoder.position_bias.weight"], length, keys, cache_index, False, arch)
    sees_source = (encoder_mask > 0)[:, None, :]
    updated = []
    for index in range(arch.decoder_layers):
        block, site = f"decoder.block.{index}", _site("decoder", arch, index)
        h = norm(ops, p, arch, f"{block}.attention_norm", x)
        self_keys, self_values = keys_values(ops, p, arch, f"{block}.self_attention", h)
        if cache is not None:
            self_keys = ops.cache_write(cache[index][0], self_keys, cache_index)
            self_values = ops.cache_write(cache[index][1], self_values, cache_index)
            updated.append((self_keys, self_values))
        attended = attend(ops, p, arch, f"{block}.self_attention", h, self_keys, self_values, causal,
                          cache is None, bias, site)
        x = x + ops.dropout(attended, arch.dropout, site + 1)
        h = norm(ops, p, arch, f"{block}.cross_attention_norm", x)
        attended = attend(ops, p, arch, f"{block}.cross_attention", h, *cross[index], sees_source, False, None,
                          site + 4)
        x = x + ops.dropout(attended, arch.dropout, site + 5)
        x = x + ops.dropout(mlp(ops, p, arch, block, norm(ops, p, arch, f"{block}.mlp_norm", x), site + 2),
                            arch.dropout, site + 3)
    x = ops.dropout(norm(ops, p, arch, "decoder.final_norm", x), arch.dropout,
                    _site("decoder", arch, arch.decoder_layers))
    if arch.scaled_outputs:
        x = x * ops.cast_like(ops.constant(np.float32(arch.hidden_size ** -0.5)), x)
    logits = ops.float32(ops.linear(x, p["embeddings.word.weight" if arch.tied else "lm_head.weight"], None))
    return logits if cache is None else (logits, tuple(updated))


def forward(ops: Ops, p: Mapping[str, Any], arch: T5Arch, input_ids: Any, attention_mask: Any,
            decoder_input_ids: Any) -> Any:
    """Teacher-forced logits float32 [B, T, V]: input_ids, attention_mask [B, S] through the encoder,
    decoder_input_ids [B, T] through the decoder."""
    encoded = encode(ops, p, arch, input_ids, attention_mask)
    return decode(ops, p, arch, decoder_input_ids, encoded, attention_mask)


def shift_right(labels: np.ndarray, start_id: int) -> np.ndarray:
    """The decoder's inputs [B, T] of targets [B, T]: each row's targets one place later, `start_id` first (HF's
    `_shift_right`; a padded target's padding stays padding)."""
    shifted = np.empty_like(labels)
    shifted[:, 0], shifted[:, 1:] = start_id, labels[:, :-1]
    return shifted


MODULES = MappingProxyType({
    "self_attention": "layer.0.SelfAttention", "attention_norm": "layer.0.layer_norm",
    "cross_attention": "layer.1.EncDecAttention", "cross_attention_norm": "layer.1.layer_norm",
})
"""Canonical block module -> HF's, below `{stack}.block.{index}` (the MLP's layer is 1 in the encoder, 2 in the
decoder); an attention's query, key, value and output are HF's q, k, v and o."""
ATTENTION_PARTS = MappingProxyType({"query": "q", "key": "k", "value": "v", "output": "o"})
TENSOR_ROLES = MappingProxyType({"query": "column", "key": "column", "value": "column", "gate": "column",
                                 "up": "column", "output": "row", "down": "row"})
"""Each projection's tensor-parallel role (`tpuplex.sharding`), over canonical names."""


@dataclasses.dataclass(frozen=True)
class T5Family:
    """The T5 family: config.json's `model_type` values, HF's class, and its parameter names."""

    model_types: tuple[str, ...] = ("t5", "mt5")
    hf_class: str = "T5ForConditionalGeneration"
    peft_targets: tuple[str, ...] | None = ("q", "v")

    @property
    def name(self) -> str:
        return self.model_types[0]

    def architecture(self, hf_config: Mapping[str, Any], path: Path | str = "config.json") -> T5Arch:
        arch = read(ConfigReader(hf_config, path))
        return dataclasses.replace(arch, family=hf_config.get("model_type", "t5"))

    def hf_name(self, canonical: str, gated: bool = False) -> str:
        """`decoder.block.3.cross_attention.query.weight` -> `decoder.block.3.layer.1.EncDecAttention.q.weight`;
        `gated`: the MLP is v1.1's, whose up projection HF calls wi_1 (v1.0's: wi)."""
        if canonical == "embeddings.word.weight":
            return "shared.weight"
        if canonical == "lm_head.weight":
            return canonical
        stack, rest = canonical.split(".", 1)
        if rest == "position_bias.weight":
            return f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        if rest == "final_norm.weight":
            return f"{stack}.final_layer_norm.weight"
        _, index, module, *parts = rest.split(".")
        prefix = f"{stack}.block.{index}"
        mlp_layer = 1 if stack == "encoder" else 2
        if module in ("gate", "up", "down"):
            leaf = {"gate": "wi_0", "up": "wi_1" if gated else "wi", "down": "wo"}[module]
            return f"{prefix}.layer.{mlp_layer}.DenseReluDense.{leaf}.{parts[-1]}"
        if module == "mlp_norm":
            return f"{prefix}.layer.{mlp_layer}.layer_norm.{parts[-1]}"
        if module in ("attention_norm", "cross_attention_norm"):
            return f"{prefix}.{MODULES[module]}.{parts[-1]}"
        return f"{prefix}.{MODULES[module]}.{ATTENTION_PARTS[parts[0]]}.{parts[1]}"

    def hf_names(self, arch: T5Arch) -> dict[str, str]:
        """Canonical name -> HF name of every parameter."""
        return {name: self.hf_name(name, arch.gated_mlp) for name in canonical_shapes(arch)}

    def hf_shapes(self, arch: T5Arch) -> dict[str, tuple[int, ...]]:
        """HF name -> portable shape of every parameter."""
        return {self.hf_name(name, arch.gated_mlp): shape for name, shape in canonical_shapes(arch).items()}

    def hf_weights(self, arch: T5Arch, params: Mapping[str, SliceReader]) -> dict[str, SliceReader]:
        return dict(params)

    def tensor_dims(self, arch: T5Arch) -> dict[str, int]:
        """HF name -> the dimension of the portable weight [out, in] its tensor-parallel role splits."""
        dims = {}
        for canonical, hf in self.hf_names(arch).items():
            part = canonical.split(".")[-2]
            if ".block." in canonical and part in TENSOR_ROLES:
                dims[hf] = 0 if TENSOR_ROLES[part] == "column" else 1
        return dims

    def tied_names(self, arch: T5Arch) -> dict[str, str]:
        """HF's tied aliases -> the parameter they are: both stacks' embed_tokens, and a tied LM head."""
        aliases = {"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight"}
        return aliases | ({"lm_head.weight": "shared.weight"} if arch.tied else {})


T5 = T5Family()

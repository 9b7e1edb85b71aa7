"""Decoder families in Flax linen, built from the core's `DecoderArch` (`tpuplex.models.decoder`).

One module per concept (`Embeddings`, `Block`), named after the canonical parameter names, assembled by `Decoder`
(`DecoderModel`). The same call trains (no cache: causal attention over the rows) and decodes (a key/value cache
of S positions written at `cache_index`, with a key mask for left-padded prompts); `generate` runs the whole
decoding loop as one compiled program per (prompt bucket, new tokens).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

import jax
from tpuplex.kinds.decoder import parameter_names, parameter_shapes
from tpuplex.kinds.jax import Built, KindModule
from tpuplex.layers.jax import ACTIVATIONS, Embed, Naming, flax_views
from tpuplex.models.decoder import DecoderArch
from tpuplex.models.lora import Lora
from tpuplex.params import check_names
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts

Cache = tuple[tuple[jax.Array, jax.Array], ...]
"""Each layer's (keys, values), [B, S, kv_heads, head_dim]."""


def rotary(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """HF Llama's rotary embedding of x [B, T, heads, D] at positions [B, T] (halves rotated, not pairs)."""
    half = x.shape[-1] // 2
    inverse = 1.0 / (theta ** (jnp.arange(0, half, dtype=jnp.float32) * 2 / x.shape[-1]))
    angles = positions[..., None].astype(jnp.float32) * inverse  # [B, T, D/2]
    cos, sin = (jnp.concatenate([f(angles)] * 2, axis=-1)[:, :, None, :].astype(x.dtype) for f in (jnp.cos, jnp.sin))
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def norm(arch: DecoderArch, dtype: Any, name: str) -> nn.Module:
    if arch.rms_norm:
        return nn.RMSNorm(epsilon=arch.norm_eps, dtype=dtype, name=name)
    return nn.LayerNorm(epsilon=arch.norm_eps, use_bias=arch.norm_bias, dtype=dtype, name=name)


class LoraMatrix(nn.Module):
    """A LoRA matrix, its weight [out, in] in torch's layout in every family (x [..., in] -> [..., out])."""

    features: int
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        weight = self.param("weight", nn.initializers.zeros, (self.features, x.shape[-1]))
        x, weight = nn.dtypes.promote_dtype(x, weight, dtype=self.dtype)
        return x @ weight.T


class Block(nn.Module):
    """A pre-norm decoder block: [B, T, H] -> ([B, T, H], this layer's updated cache entry or None)."""

    arch: DecoderArch
    dtype: Any
    lora: Lora | None = None

    @nn.compact
    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array, cache: tuple | None,
                 cache_index: jax.Array, deterministic: bool) -> tuple[jax.Array, tuple | None]:
        """mask [B or 1, T, S]: which keys each query sees; cache: (keys, values) [B, S, kv, D] or None."""
        a = self.arch
        rows, length = x.shape[:2]
        heads, kv, size = a.num_heads, a.num_kv_heads, a.head_dim
        lora = self.lora

        def dense(features: int, bias: bool, name: str, h: jax.Array) -> jax.Array:
            """The projection `name`, with its LoRA adapter when it has one: + scale * B A dropout(h)."""
            y = nn.Dense(features, use_bias=bias, dtype=self.dtype, name=name)(h)
            if lora is None or not lora.adapts(f"{self.name}.{name}"):
                return y
            low = LoraMatrix(lora.rank, self.dtype, name=f"{name}.lora_A")(
                nn.Dropout(lora.dropout)(h, deterministic=deterministic))
            return y + LoraMatrix(features, self.dtype, name=f"{name}.lora_B")(low) * lora.scale

        h = norm(a, self.dtype, "attention_norm")(x)
        if a.fused_qkv:
            query, key, value = jnp.split(dense((heads + 2 * kv) * size, a.attention_bias, "qkv", h),
                                          [heads * size, (heads + kv) * size], axis=-1)
        else:
            query, key, value = (dense(count * size, a.attention_bias, name, h)
                                 for count, name in ((heads, "query"), (kv, "key"), (kv, "value")))
        query = query.reshape(rows, length, heads, size)
        key, value = key.reshape(rows, length, kv, size), value.reshape(rows, length, kv, size)
        if a.rope_theta:
            query, key = rotary(query, positions, a.rope_theta), rotary(key, positions, a.rope_theta)
        if cache is not None:
            start = (0, cache_index, 0, 0)
            key = jax.lax.dynamic_update_slice(cache[0], key.astype(cache[0].dtype), start)
            value = jax.lax.dynamic_update_slice(cache[1], value.astype(cache[1].dtype), start)
            cache = (key, value)
        # Grouped-query attention: query head h reads key/value head h // (heads / kv), as HF's repeat_kv.
        query = query.reshape(rows, length, kv, heads // kv, size)
        scores = jnp.einsum("btkgd,bskd->bkgts", query, key).astype(jnp.float32) / math.sqrt(size)
        scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
        probs = nn.Dropout(a.attention_dropout)(jax.nn.softmax(scores, axis=-1), deterministic=deterministic)
        context = jnp.einsum("bkgts,bskd->btkgd", probs.astype(self.dtype), value).reshape(rows, length, -1)
        attended = dense(a.hidden_size, a.attention_bias, "attention_output", context)
        x = x + nn.Dropout(a.residual_dropout)(attended, deterministic=deterministic)
        h = norm(a, self.dtype, "mlp_norm")(x)
        up = dense(a.intermediate_size, a.mlp_bias, "up", h)
        if a.gated_mlp:
            inner = ACTIVATIONS[a.activation](dense(a.intermediate_size, a.mlp_bias, "gate", h)) * up
        else:
            inner = ACTIVATIONS[a.activation](up)
        out = dense(a.hidden_size, a.mlp_bias, "down", inner)
        return x + nn.Dropout(a.residual_dropout)(out, deterministic=deterministic), cache


class DecoderModel(nn.Module):
    """The decoder: input_ids int32 [B, T] -> next-token logits float32 [B, T, V].

    Training calls it with the ids alone (positions 0..T-1, causal attention). Decoding passes `positions` [B, T],
    a `cache` (each layer's keys and values over S positions) written from `cache_index`, and `key_mask` [B, S]
    (0 on the prompts' left padding); it then returns (logits, updated cache).
    """

    arch: DecoderArch
    dtype: Any = jnp.float32
    lora: Lora | None = None

    @nn.compact
    def __call__(self, input_ids: jax.Array, deterministic: bool = True, positions: jax.Array | None = None,
                 cache: Cache | None = None, cache_index: jax.Array | int = 0, key_mask: jax.Array | None = None
                 ) -> Any:
        a = self.arch
        length = input_ids.shape[1]
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(length), input_ids.shape)
        word = Embed(a.vocab_size, a.hidden_size, dtype=self.dtype, name="embeddings.word")
        x = word(input_ids)
        if not a.rope_theta:
            x = x + Embed(a.max_positions, a.hidden_size, dtype=self.dtype, name="embeddings.position")(positions)
        x = nn.Dropout(a.embedding_dropout)(x, deterministic=deterministic)
        keys = length if cache is None else cache[0][0].shape[1]
        mask = (jnp.arange(keys)[None, :] <= cache_index + jnp.arange(length)[:, None])[None]
        if key_mask is not None:
            mask = mask & key_mask[:, None, :].astype(bool)
        updated = []
        for index in range(a.num_layers):
            x, entry = Block(a, self.dtype, self.lora, name=f"block.{index}")(
                x, positions, mask, None if cache is None else cache[index], cache_index, deterministic)
            updated.append(entry)
        x = norm(a, self.dtype, "final_norm")(x)
        head = word if a.tied else Embed(a.vocab_size, a.hidden_size, dtype=self.dtype, name="lm_head")
        logits = head.attend(x).astype(jnp.float32)
        return logits if cache is None else (logits, tuple(updated))


def param_template(model: nn.Module) -> Any:
    ids = jnp.zeros((1, 1), jnp.int32)
    return jax.eval_shape(lambda: model.init(jax.random.key(0), ids)["params"])


def sample(logits: jax.Array, temperature: float, top_k: int, uniform: jax.Array) -> jax.Array:
    """int32 [B]: the most likely token of logits [B, V] (temperature 0), else the token where the CDF of
    softmax(logits / temperature), restricted to the top_k, first exceeds uniform [B]."""
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scaled = logits / temperature
    if top_k:
        kth = jax.lax.top_k(scaled, min(top_k, scaled.shape[-1]))[0][:, -1:]
        scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    cdf = jnp.cumsum(jax.nn.softmax(scaled, axis=-1), axis=-1)
    chosen = jnp.sum(cdf < uniform[:, None] * cdf[:, -1:], axis=-1)
    return jnp.minimum(chosen, logits.shape[-1] - 1).astype(jnp.int32)


def decode(network: DecoderModel, params: Any, ids: jax.Array, mask: jax.Array, uniforms: jax.Array,
           new_tokens: int, temperature: float, top_k: int, cache: bool) -> jax.Array:
    """int32 [B, N]: N tokens after the left-padded prompts ids, mask [B, P] (see `tpuplex.protocol.Prompts`)."""
    a = network.arch
    rows, length = ids.shape
    total = length + new_tokens
    key_mask = jnp.concatenate([mask, jnp.ones((rows, new_tokens), mask.dtype)], axis=1)
    positions = jnp.maximum(jnp.cumsum(key_mask, axis=1) - 1, 0)
    pick = functools.partial(sample, temperature=temperature, top_k=top_k)
    tokens = jnp.zeros((rows, total), jnp.int32).at[:, :length].set(ids)
    if cache:
        empty = tuple((jnp.zeros((rows, total, a.num_kv_heads, a.head_dim), network.dtype),) * 2
                      for _ in range(a.num_layers))
        logits, kv = network.apply({"params": params}, ids, positions=positions[:, :length], cache=empty,
                                   cache_index=0, key_mask=key_mask)
    else:
        kv, logits = None, network.apply({"params": params}, tokens, positions=positions, key_mask=key_mask)
    tokens = tokens.at[:, length].set(pick(logits[:, length - 1], uniform=uniforms[:, 0]))

    def step(index: jax.Array, carry: tuple) -> tuple:
        tokens, kv = carry
        at = length + index  # the newest token's place
        if cache:
            current = jax.lax.dynamic_slice_in_dim(tokens, at, 1, axis=1)
            where = jax.lax.dynamic_slice_in_dim(positions, at, 1, axis=1)
            logits, kv = network.apply({"params": params}, current, positions=where, cache=kv, cache_index=at,
                                       key_mask=key_mask)
            last = logits[:, 0]
        else:
            logits = network.apply({"params": params}, tokens, positions=positions, key_mask=key_mask)
            last = jax.lax.dynamic_index_in_dim(logits, at, axis=1, keepdims=False)
        chosen = pick(last, uniform=jax.lax.dynamic_index_in_dim(uniforms, index + 1, axis=1, keepdims=False))
        return jax.lax.dynamic_update_slice_in_dim(tokens, chosen[:, None], at + 1, axis=1), kv

    tokens, _ = jax.lax.fori_loop(0, new_tokens - 1, step, (tokens, kv))
    return tokens[:, length:]


class Decoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec, batch_shards: int) -> Built:
        dtype = jnp.bfloat16 if optimizer.bf16 else jnp.float32
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        lora = spec.lora if spec.dropout or spec.lora is None else spec.lora.without_dropout()
        naming = Naming(parameter_names(spec), torch_layout=arch.kernel_layout == "out_in")
        check_names(parameter_shapes(spec), spec.params, "model.params")
        network = DecoderModel(arch, dtype, lora)
        return Built(network, flax_views(spec.params, param_template(network), naming), {}, naming, Naming.native({}),
                     arch.max_length)

    def generate(self, network: DecoderModel, params: Any, prompts: Prompts) -> np.ndarray:
        program = _programs(network, prompts.new_tokens, prompts.temperature, prompts.top_k, prompts.cache)
        return np.asarray(program(params, prompts.ids, prompts.mask, np.asarray(prompts.uniforms, np.float32)))


@functools.lru_cache(maxsize=16)
def _programs(network: DecoderModel, new_tokens: int, temperature: float, top_k: int, cache: bool):
    """One compiled decoding program per network and settings (and, by jit, per prompt bucket)."""
    return jax.jit(functools.partial(decode, network, new_tokens=new_tokens, temperature=temperature, top_k=top_k,
                                     cache=cache))

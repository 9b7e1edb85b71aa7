"""The decoder families in Flax: the parameters as a flat tree under their canonical names in the portable layout,
run by the forward pass written once (`tpuplex.models.decoder.forward`) over jax's table of operations
(`tpuplex_jax.ops.JaxOps`). The same call trains (no cache: causal attention over the rows) and decodes (a
key/value cache of S positions written at `cache_index`, with a key mask for left-padded prompts); `generate` runs
the whole decoding loop as one compiled program per (prompt bucket, new tokens).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

import jax
from tpuplex.checkpoints import check_names
from tpuplex.kinds.decoder import parameter_names, parameter_shapes
from tpuplex.models import decoder
from tpuplex.models.decoder import DecoderArch
from tpuplex.models.lora import Lora
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts
from tpuplex_jax.kinds import Built, KindModule
from tpuplex_jax.ops import JaxOps, Naming, flax_views


class DecoderModel(nn.Module):
    """input_ids int32 [B, T] -> next-token logits float32 [B, T, V]; with a cache, (logits, the updated cache)
    (`tpuplex.models.decoder.forward`'s arguments). shapes: (canonical name, portable shape) of every parameter."""

    arch: DecoderArch
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    dtype: Any = jnp.float32
    lora: Lora | None = None

    @nn.compact
    def __call__(self, input_ids: jax.Array, deterministic: bool = True, **decoding) -> Any:
        params = {name: self.param(name, nn.initializers.zeros, shape) for name, shape in self.shapes}
        return decoder.forward(JaxOps(self, deterministic, self.dtype), params, self.arch, input_ids,
                               lora=self.lora, **decoding)


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
        names, shapes = parameter_names(spec), parameter_shapes(spec)
        naming = Naming(names, torch_layout=False)
        check_names(shapes, spec.params, "model.params")
        network = DecoderModel(arch, tuple((name, shapes[hf]) for name, hf in names.items()), dtype, lora)
        template = {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in network.shapes}
        return Built(network, flax_views(spec.params, template, naming), {}, naming, Naming.native({}),
                     arch.max_length)

    def generate(self, network: DecoderModel, params: Any, prompts: Prompts) -> np.ndarray:
        program = _programs(network, prompts.new_tokens, prompts.temperature, prompts.top_k, prompts.cache)
        return np.asarray(program(params, prompts.ids, prompts.mask, np.asarray(prompts.uniforms, np.float32)))


@functools.lru_cache(maxsize=16)
def _programs(network: DecoderModel, new_tokens: int, temperature: float, top_k: int, cache: bool):
    """One compiled decoding program per network and settings (and, by jit, per prompt bucket)."""
    return jax.jit(functools.partial(decode, network, new_tokens=new_tokens, temperature=temperature, top_k=top_k,
                                     cache=cache))

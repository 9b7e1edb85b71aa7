"""T5 in Flax: the parameters as a flat tree under their canonical names in the portable layout, run by the forward
pass written once (`tpuplex.models.t5`) over jax's table of operations (`tpuplex_jax.ops.JaxOps`). `generate`
encodes once and runs one compiled decoder step per token (`tpuplex.models.search`), the self-attention cache
reordered by the search inside that step: one program per (input bucket, rows, new tokens), none per token.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

import jax
from tpuplex.checkpoints import check_names
from tpuplex.kinds.encoder_decoder import parameter_names, parameter_shapes
from tpuplex.models import search, t5
from tpuplex.models.t5 import T5Arch
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts
from tpuplex_jax.kinds import Built, KindModule
from tpuplex_jax.ops import JaxOps, Naming, flax_views


class T5Model(nn.Module):
    """(input_ids, attention_mask [B, S], decoder_input_ids [B, T]) -> next-token logits float32 [B, T, V].
    shapes: (canonical name, portable shape) of every parameter. Generation calls it at `stage` "encode"
    (input_ids, attention_mask -> every decoder layer's cross-attention keys and values) and "step" (one token a row
    over the self-attention cache: `step`'s arguments -> (logits [R, V], the updated cache))."""

    arch: T5Arch
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, *inputs: Any, deterministic: bool = True, stage: str = "train") -> Any:
        p = {name: self.param(name, nn.initializers.zeros, shape) for name, shape in self.shapes}
        ops, arch = JaxOps(self, deterministic, self.dtype), self.arch
        if stage == "encode":
            return t5.cross_keys(ops, p, arch, t5.encode(ops, p, arch, *inputs))
        if stage == "step":
            tokens, cross, mask, cache, position = inputs
            logits, cache = t5.decode(ops, p, arch, tokens[:, None], None, mask, cross=cross, cache=cache,
                                      cache_index=position)
            return logits[:, 0], cache
        return t5.forward(ops, p, arch, *inputs)


class EncoderDecoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec, batch_shards: int) -> Built:
        dtype = jnp.bfloat16 if optimizer.bf16 else jnp.float32
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        names, shapes = parameter_names(spec), parameter_shapes(spec)
        naming = Naming(names, torch_layout=False)
        check_names(shapes, spec.params, "model.params")
        network = T5Model(arch, tuple((name, shapes[hf]) for name, hf in names.items()), dtype)
        template = {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in network.shapes}
        return Built(network, flax_views(spec.params, template, naming), {}, naming, Naming.native({}),
                     arch.max_length)

    def generate(self, network: T5Model, params: Any, prompts: Prompts) -> np.ndarray:
        """The inputs [B, S] through the encoder once (one program), then `tpuplex.models.search` over one
        compiled decoder step a token."""
        arch, beams = network.arch, prompts.beams
        ids = np.repeat(np.asarray(prompts.ids, np.int32), beams, axis=0)
        mask = np.repeat(np.asarray(prompts.mask, np.int32), beams, axis=0)
        encode, step = _programs(network)
        cross = encode(params, ids, mask)
        shape = (len(ids), prompts.new_tokens, arch.num_heads, arch.head_dim)
        cache = tuple((jnp.zeros(shape, network.dtype), jnp.zeros(shape, network.dtype))
                      for _ in range(arch.decoder_layers))  # distinct buffers: the step donates them

        def decode(tokens: np.ndarray, origin: np.ndarray, position: int) -> np.ndarray:
            nonlocal cache
            logits, cache = step(params, tokens, origin, cross, mask, cache, position)
            return np.asarray(logits, np.float32)

        return search.generate(decode, prompts, arch.decoder_start_id, arch.eos_id, arch.pad_id)


@functools.lru_cache(maxsize=16)
def _programs(network: T5Model):
    """The compiled encoder (with every layer's cross-attention keys and values) and decoder step of `network`
    (by jit, one per shape of their arguments); the step takes the cache from rows `origin` first."""
    def encode(params, ids, mask):
        return network.apply({"params": params}, ids, mask, stage="encode")

    def step(params, tokens, origin, cross, mask, cache, position):
        cache = jax.tree_util.tree_map(lambda entry: jnp.take(entry, origin, axis=0), cache)
        return network.apply({"params": params}, tokens, cross, mask, cache, position, stage="step")

    return jax.jit(encode), jax.jit(step, donate_argnums=(5,))

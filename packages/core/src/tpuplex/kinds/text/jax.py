"""Text encoder families in Flax linen, built from the core's `Architecture` with the task's head.

One module per concept (`Embeddings`, `Block`), assembled with the task's head module
(`tpuplex.tasks.jax.TaskModule.build_head`) by `TaskModel`, named after the canonical parameter names
(`tpuplex.layers.jax.Naming`).

Linen rather than NNX: the training step is a pure function of a parameter pytree (`model.apply(params, ...)`),
which is what `jax.jit`, `jax.grad` and optax consume directly, with no split/merge of module state.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

import jax
from tpuplex.kinds.jax import Built, KindModule
from tpuplex.kinds.text import expected_shapes
from tpuplex.layers.jax import ACTIVATIONS, Embed, Naming, attention, flax_views
from tpuplex.models import Architecture
from tpuplex.params import check_names
from tpuplex.protocol import ModelSpec, OptimizerSpec


class Embeddings(nn.Module):
    arch: Architecture
    dtype: Any

    @nn.compact
    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array, deterministic: bool) -> jax.Array:
        """[B, L] ids -> [B, L, hidden]: word + position (+ token type) embeddings, LayerNorm, dropout, and the
        projection to the hidden size for factorised embeddings."""
        a = self.arch
        embed = lambda size, name: Embed(size, a.embedding_size, dtype=self.dtype, name=name)  # noqa: E731
        positions = jnp.arange(input_ids.shape[1])[None, :] + a.position_offset
        x = embed(a.vocab_size, "word")(input_ids) + embed(a.max_positions, "position")(positions)
        if a.type_vocab_size:
            # Families without segments (RoBERTa) add type 0 everywhere, as HF's default token_type_ids do.
            segments = token_type_ids if a.token_types else jnp.zeros_like(input_ids)
            x = x + embed(a.type_vocab_size, "token_type")(segments)
        x = nn.LayerNorm(epsilon=a.layer_norm_eps, dtype=self.dtype, name="norm")(x)
        x = nn.Dropout(a.embedding_dropout)(x, deterministic=deterministic)
        if a.embedding_projection:
            x = nn.Dense(a.hidden_size, dtype=self.dtype, name="projection")(x)
        return x


class Block(nn.Module):
    """A post-LayerNorm transformer block: [B, L, hidden] -> [B, L, hidden]."""

    arch: Architecture
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array, attention_mask: jax.Array, deterministic: bool) -> jax.Array:
        """attention_mask int32 [B, L]: 1 on real tokens, 0 on the right padding."""
        a = self.arch
        head_dim = a.hidden_size // a.num_heads
        dense = lambda features, name: nn.Dense(features, dtype=self.dtype, name=name)  # noqa: E731
        norm = lambda name: nn.LayerNorm(epsilon=a.layer_norm_eps, dtype=self.dtype, name=name)  # noqa: E731

        def heads(name: str) -> jax.Array:  # [B, L, hidden] -> [B, L, heads, head_dim]
            y = dense(a.hidden_size, name)(x)
            return y.reshape(*y.shape[:2], a.num_heads, head_dim)

        dropout = None
        if a.attention_dropout and not deterministic:  # without it (config.json: 0) a fused kernel on GPUs
            dropout = functools.partial(nn.Dropout(a.attention_dropout), deterministic=False)
        context = attention(heads("query"), heads("key"), heads("value"), attention_mask.sum(axis=-1), dropout)
        context = context.reshape(x.shape)
        attended = nn.Dropout(a.attention_output_dropout)(dense(a.hidden_size, "attention_output")(context),
                                                          deterministic=deterministic)
        attended = norm("attention_norm")(x + attended)
        inner = ACTIVATIONS[a.hidden_act](dense(a.intermediate_size, "intermediate")(attended))
        out = nn.Dropout(a.ffn_output_dropout)(dense(a.hidden_size, "output")(inner), deterministic=deterministic)
        return norm("output_norm")(attended + out)


class TaskModel(nn.Module):
    """The family's encoder with a task's head: embeddings, the blocks in `arch.block_schedule` order (shared
    blocks are one module called again), then `head` (the task's Flax module, `tpuplex.tasks`), which takes the
    hidden states [B, L, hidden] and the word embedding table (tied decoders read it).

    dtype is the compute dtype (float32, or bfloat16 with float32 parameters).
    """

    arch: Architecture
    head: nn.Module
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array, attention_mask: jax.Array,
                 deterministic: bool = True, **head_inputs: jax.Array) -> Any:
        """input_ids, token_type_ids, attention_mask int32 [B, L] -> the head's outputs; `head_inputs` (the batch's
        further entries, `tpuplex.protocol.head_inputs`) go to the head."""
        a = self.arch
        embeddings = Embeddings(a, self.dtype, name="embeddings")
        x = embeddings(input_ids, token_type_ids, deterministic)
        blocks = [Block(a, self.dtype, name=f"block.{index}") for index in range(a.num_blocks)]
        for index in a.block_schedule:
            x = blocks[index](x, attention_mask, deterministic)
        return self.head(x, embeddings.variables["params"]["word"]["embedding"], deterministic, **head_inputs)


def param_template(model: nn.Module) -> Any:
    """The Flax parameter tree's structure with jax.ShapeDtypeStruct leaves, computed without allocating."""
    ids = jnp.zeros((1, 1), jnp.int32)
    return jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids, deterministic=True)["params"])


class TextEncoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec, batch_shards: int) -> Built:
        dtype = jnp.bfloat16 if optimizer.bf16 else jnp.float32
        arch, head = (spec.arch, spec.head) if spec.dropout else (spec.arch.without_dropout(),
                                                                  spec.head.without_dropout())
        naming = Naming({**spec.family.hf_names(arch), **{name: head.hf_name(name) for name in head.shapes}})
        check_names(expected_shapes(spec.hf_config, head), spec.params, "model.params")
        network = TaskModel(arch, task.build_head(arch, head, dtype), dtype)
        return Built(network, flax_views(spec.params, param_template(network), naming), {}, naming, Naming.native({}),
                     arch.max_length)

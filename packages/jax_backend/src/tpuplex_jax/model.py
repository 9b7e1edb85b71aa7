"""An encoder in Flax linen, built from the core's `Architecture` (any supported family), with a task's head.

One module per concept (`Embeddings`, `Block`), assembled with the task's head module by `TaskModel`. Modules are
named after the
core's *canonical* parameter names, so a parameter's tree path spells its canonical name (`block.3/query/kernel`
is `block.3.query.weight`, transposed: Flax keeps Dense kernels [in, out], torch [out, in]); the family's table
(`Family.hf_names`) turns those into HF names. A `Naming` holds that table; `to_flax` / `to_portable_arrays`
convert whole trees with it (parameters, and Adam moments, which share the layout). A user's own Flax module
(`tpuplex.models.user`) gets a native `Naming`: its tree paths as they are.

Linen rather than NNX: the training step is a pure function of a parameter pytree (`model.apply(params, ...)`),
which is what `jax.pmap`, `jax.grad` and optax consume directly, with no split/merge of module state.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

import jax
from tpuplex.models import Architecture
from tpuplex.params import from_torch_layout, to_torch_layout, torch_shape

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # HF "gelu" is the exact erf form
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
}
_CANONICAL_LEAF = {"kernel": "weight", "scale": "weight", "embedding": "weight", "bias": "bias"}


class Embeddings(nn.Module):
    arch: Architecture
    dtype: Any

    @nn.compact
    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array, deterministic: bool) -> jax.Array:
        """[B, L] ids -> [B, L, hidden]: word + position (+ token type) embeddings, LayerNorm, dropout, and the
        projection to the hidden size for factorised embeddings."""
        a = self.arch
        embed = lambda size, name: nn.Embed(size, a.embedding_size, dtype=self.dtype, name=name)  # noqa: E731
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
    def __call__(self, x: jax.Array, mask_bias: jax.Array, deterministic: bool) -> jax.Array:
        """mask_bias [B, 1, 1, L]: 0 on real keys, float32's min on padding keys."""
        a = self.arch
        head_dim = a.hidden_size // a.num_heads
        dense = lambda features, name: nn.Dense(features, dtype=self.dtype, name=name)  # noqa: E731
        norm = lambda name: nn.LayerNorm(epsilon=a.layer_norm_eps, dtype=self.dtype, name=name)  # noqa: E731

        def heads(name: str) -> jax.Array:  # [B, L, hidden] -> [B, heads, L, head_dim]
            y = dense(a.hidden_size, name)(x)
            return y.reshape(*y.shape[:2], a.num_heads, head_dim).transpose(0, 2, 1, 3)

        query, key, value = heads("query"), heads("key"), heads("value")
        # Scores and softmax in float32 even under bf16 compute: the masked keys' large negative bias needs it.
        scores = jnp.einsum("bhqd,bhkd->bhqk", query, key).astype(jnp.float32) / math.sqrt(head_dim) + mask_bias
        probs = nn.Dropout(a.attention_dropout)(jax.nn.softmax(scores, axis=-1), deterministic=deterministic)
        context = jnp.einsum("bhqk,bhkd->bhqd", probs.astype(self.dtype), value)
        context = context.transpose(0, 2, 1, 3).reshape(x.shape)
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
        # HF's extended attention mask: 0 on real keys, the dtype's minimum on padding keys.
        mask_bias = (1.0 - attention_mask[:, None, None, :].astype(jnp.float32)) * jnp.finfo(jnp.float32).min
        blocks = [Block(a, self.dtype, name=f"block.{index}") for index in range(a.num_blocks)]
        for index in a.block_schedule:
            x = blocks[index](x, mask_bias, deterministic)
        return self.head(x, embeddings.variables["params"]["word"]["embedding"], deterministic, **head_inputs)


def canonical_name(path: tuple[Any, ...]) -> str:
    """The canonical name of the Flax parameter at tree `path` (jax.tree_util key path or plain strings)."""
    *modules, leaf = (getattr(key, "key", key) for key in path)
    return ".".join([*modules, _CANONICAL_LEAF.get(leaf, leaf)])


def _is_kernel(path: tuple[Any, ...]) -> bool:
    return getattr(path[-1], "key", path[-1]) == "kernel"


@dataclasses.dataclass(frozen=True)
class Naming:
    """How the paths of a Flax tree become portable names.

    names: canonical name -> portable name (HF names for a family, from `Family.hf_names`).
    torch_layout: kernels take torch's layout (Dense [out, in], Conv OIHW) for HF families; a user model's
        arrays keep their Flax layout.
    """

    names: Mapping[str, str]
    torch_layout: bool = True

    @classmethod
    def native(cls, tree: Any) -> Naming:
        """A user model's naming: the tree path joined with ".", leaves as Flax calls them, Flax layout."""
        flat = jax.tree_util.tree_flatten_with_path(tree)[0]
        return cls({canonical_name(path): ".".join(str(getattr(key, "key", key)) for key in path)
                    for path, _ in flat}, torch_layout=False)

    @classmethod
    def hf(cls, tree: Any, collection: bool = False) -> Naming:
        """A tree whose module names are already HF's (the image families): the canonical names as they are,
        without the Flax collection's name (`batch_stats`) when `collection`."""
        flat = jax.tree_util.tree_flatten_with_path(tree)[0]
        names = (canonical_name(path) for path, _ in flat)
        return cls({name: name.split(".", 1)[1] if collection else name for name in names})

    def of(self, path: tuple[Any, ...]) -> str:
        return self.names[canonical_name(path)]

    def transposed(self, path: tuple[Any, ...]) -> bool:
        return self.torch_layout and _is_kernel(path)

    def shapes(self, template: Any) -> dict[str, tuple[int, ...]]:
        """Portable name -> portable shape of every leaf of `template`."""
        flat = jax.tree_util.tree_flatten_with_path(template)[0]
        return {self.of(path): torch_shape(tuple(leaf.shape))
                if self.transposed(path) else tuple(leaf.shape) for path, leaf in flat}


def param_template(model: nn.Module) -> Any:
    """The Flax parameter tree's structure with jax.ShapeDtypeStruct leaves, computed without allocating."""
    ids = jnp.zeros((1, 1), jnp.int32)
    return jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids, deterministic=True)["params"])


def to_flax(arrays: Mapping[str, np.ndarray], template: Any, naming: Naming) -> Any:
    """Portable arrays -> a Flax tree shaped like `template` (numpy leaves of the template's dtypes)."""
    def convert(path, leaf):
        array = np.asarray(arrays[naming.of(path)], dtype=leaf.dtype)
        return from_torch_layout(array) if naming.transposed(path) else array

    return jax.tree_util.tree_map_with_path(convert, template)


def to_portable_arrays(tree: Any, naming: Naming) -> dict[str, np.ndarray]:
    """A Flax tree (parameters, Adam moments, batch statistics) -> portable numpy arrays: float32, counts int64."""
    def portable(path, leaf) -> np.ndarray:
        array = np.asarray(leaf)
        array = array.astype(np.int64 if np.issubdtype(array.dtype, np.integer) else np.float32)
        return to_torch_layout(array) if naming.transposed(path) else np.array(array, order="C")  # 0-d stays 0-d

    return {naming.of(path): portable(path, leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}

"""A BERT-family sequence classifier in Flax linen whose parameter tree spells the HF names.

Modules are named exactly like HF `BertForSequenceClassification` (`bert/encoder/layer.0/attention/self/query`),
so a parameter's HF name is its tree path joined with "." and its leaf renamed: Dense `kernel` -> `weight`
(transposed: Flax keeps [in, out], torch [out, in]), LayerNorm `scale` -> `weight`, Embed `embedding` -> `weight`.
`to_flax` / `to_hf` convert whole trees that way (parameters, and Adam moments, which share the layout).

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
from tpuplex.errors import TpuplexError

_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # HF "gelu" is the exact erf form
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}
_HF_LEAF = {"kernel": "weight", "scale": "weight", "embedding": "weight", "bias": "bias"}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The architecture, read from an HF `config.json`. Dropout rates are 0 when dropout is turned off."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str
    hidden_dropout: float
    attention_dropout: float
    classifier_dropout: float
    num_labels: int

    @classmethod
    def from_hf(cls, hf_config: Mapping[str, Any], num_labels: int, dropout: bool) -> BertConfig:
        act = hf_config.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise TpuplexError(f"hidden_act {act!r} in the checkpoint's config.json is not supported: "
                               f"use one of {', '.join(_ACTIVATIONS)}")
        position_type = hf_config.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise TpuplexError(f"position_embedding_type {position_type!r} is not supported: tpuplex builds BERT "
                               "encoders with absolute position embeddings")
        hidden_dropout = float(hf_config.get("hidden_dropout_prob", 0.1))
        classifier_dropout = hf_config.get("classifier_dropout")
        scale = 1.0 if dropout else 0.0
        return cls(
            vocab_size=int(hf_config["vocab_size"]), hidden_size=int(hf_config["hidden_size"]),
            num_layers=int(hf_config["num_hidden_layers"]), num_heads=int(hf_config["num_attention_heads"]),
            intermediate_size=int(hf_config["intermediate_size"]),
            max_positions=int(hf_config["max_position_embeddings"]),
            type_vocab_size=int(hf_config.get("type_vocab_size", 2)),
            layer_norm_eps=float(hf_config.get("layer_norm_eps", 1e-12)), hidden_act=act,
            hidden_dropout=scale * hidden_dropout,
            attention_dropout=scale * float(hf_config.get("attention_probs_dropout_prob", 0.1)),
            classifier_dropout=scale * float(hidden_dropout if classifier_dropout is None else classifier_dropout),
            num_labels=num_labels,
        )


class Embeddings(nn.Module):
    config: BertConfig
    dtype: Any

    @nn.compact
    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array, deterministic: bool) -> jax.Array:
        """[B, L] ids -> [B, L, hidden]: word + absolute position + segment embeddings, LayerNorm, dropout."""
        c = self.config
        embed = lambda size, name: nn.Embed(size, c.hidden_size, dtype=self.dtype, name=name)  # noqa: E731
        positions = jnp.arange(input_ids.shape[1])[None, :]
        x = (embed(c.vocab_size, "word_embeddings")(input_ids)
             + embed(c.max_positions, "position_embeddings")(positions)
             + embed(c.type_vocab_size, "token_type_embeddings")(token_type_ids))
        x = nn.LayerNorm(epsilon=c.layer_norm_eps, dtype=self.dtype, name="LayerNorm")(x)
        return nn.Dropout(c.hidden_dropout)(x, deterministic=deterministic)


class SelfAttention(nn.Module):
    config: BertConfig
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array, mask_bias: jax.Array, deterministic: bool) -> jax.Array:
        """x [B, L, hidden], mask_bias [B, 1, 1, L] (0 or the dtype's min) -> context [B, L, hidden]."""
        c = self.config
        head_dim = c.hidden_size // c.num_heads

        def heads(name: str) -> jax.Array:  # [B, L, hidden] -> [B, heads, L, head_dim]
            y = nn.Dense(c.hidden_size, dtype=self.dtype, name=name)(x)
            return y.reshape(*y.shape[:2], c.num_heads, head_dim).transpose(0, 2, 1, 3)

        query, key, value = heads("query"), heads("key"), heads("value")
        # Scores and softmax in float32 even under bf16 compute: the masked keys' large negative bias needs it.
        scores = jnp.einsum("bhqd,bhkd->bhqk", query, key).astype(jnp.float32) / math.sqrt(head_dim) + mask_bias
        probs = nn.Dropout(c.attention_dropout)(jax.nn.softmax(scores, axis=-1), deterministic=deterministic)
        context = jnp.einsum("bhqk,bhkd->bhqd", probs.astype(self.dtype), value)
        return context.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], c.hidden_size)


class ResidualNorm(nn.Module):
    """`dense` -> dropout -> `LayerNorm(y + residual)`: HF's BertSelfOutput and BertOutput."""

    config: BertConfig
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array, residual: jax.Array, deterministic: bool) -> jax.Array:
        c = self.config
        y = nn.Dense(c.hidden_size, dtype=self.dtype, name="dense")(x)
        y = nn.Dropout(c.hidden_dropout)(y, deterministic=deterministic)
        return nn.LayerNorm(epsilon=c.layer_norm_eps, dtype=self.dtype, name="LayerNorm")(y + residual)


class Projection(nn.Module):
    """`dense` then an activation: HF's BertIntermediate and BertPooler."""

    features: int
    activation: Callable[[jax.Array], jax.Array]
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return self.activation(nn.Dense(self.features, dtype=self.dtype, name="dense")(x))


class Attention(nn.Module):
    config: BertConfig
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array, mask_bias: jax.Array, deterministic: bool) -> jax.Array:
        context = SelfAttention(self.config, self.dtype, name="self")(x, mask_bias, deterministic)
        return ResidualNorm(self.config, self.dtype, name="output")(context, x, deterministic)


class Layer(nn.Module):
    config: BertConfig
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array, mask_bias: jax.Array, deterministic: bool) -> jax.Array:
        c = self.config
        attended = Attention(c, self.dtype, name="attention")(x, mask_bias, deterministic)
        inner = Projection(c.intermediate_size, _ACTIVATIONS[c.hidden_act], self.dtype, name="intermediate")(attended)
        return ResidualNorm(c, self.dtype, name="output")(inner, attended, deterministic)


class Encoder(nn.Module):
    config: BertConfig
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array, mask_bias: jax.Array, deterministic: bool) -> jax.Array:
        for index in range(self.config.num_layers):
            x = Layer(self.config, self.dtype, name=f"layer.{index}")(x, mask_bias, deterministic)
        return x


class Bert(nn.Module):
    config: BertConfig
    dtype: Any

    @nn.compact
    def __call__(self, input_ids, token_type_ids, attention_mask, deterministic: bool) -> jax.Array:
        """[B, L] int arrays -> pooled output [B, hidden] = tanh(dense(h[:, 0]))."""
        c = self.config
        x = Embeddings(c, self.dtype, name="embeddings")(input_ids, token_type_ids, deterministic)
        # HF's extended attention mask: 0 on real keys, the dtype's minimum on padding keys.
        mask_bias = (1.0 - attention_mask[:, None, None, :].astype(jnp.float32)) * jnp.finfo(jnp.float32).min
        x = Encoder(c, self.dtype, name="encoder")(x, mask_bias, deterministic)
        return Projection(c.hidden_size, jnp.tanh, self.dtype, name="pooler")(x[:, 0])


class BertClassifier(nn.Module):
    """HF `BertForSequenceClassification`: BERT, dropout on the pooled output, a linear `classifier`.

    dtype is the compute dtype (float32, or bfloat16 with float32 parameters); logits are always float32.
    """

    config: BertConfig
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array, attention_mask: jax.Array,
                 deterministic: bool = True) -> jax.Array:
        """input_ids, token_type_ids, attention_mask int32 [B, L] -> logits float32 [B, num_labels]."""
        c = self.config
        pooled = Bert(c, self.dtype, name="bert")(input_ids, token_type_ids, attention_mask, deterministic)
        pooled = nn.Dropout(c.classifier_dropout)(pooled, deterministic=deterministic)
        return nn.Dense(c.num_labels, dtype=self.dtype, name="classifier")(pooled).astype(jnp.float32)


def hf_name(path: tuple[Any, ...]) -> str:
    """The HF name of the Flax parameter at tree `path` (jax.tree_util key path or plain strings)."""
    *modules, leaf = (getattr(key, "key", key) for key in path)
    return ".".join([*modules, _HF_LEAF[leaf]])


def _is_kernel(path: tuple[Any, ...]) -> bool:
    return getattr(path[-1], "key", path[-1]) == "kernel"


def param_template(model: BertClassifier) -> Any:
    """The Flax parameter tree's structure with jax.ShapeDtypeStruct leaves, computed without allocating."""
    ids = jnp.zeros((1, 1), jnp.int32)
    return jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids)["params"])


def to_flax(arrays: Mapping[str, np.ndarray], template: Any) -> Any:
    """HF-named float32 arrays (torch layout) -> a Flax parameter tree shaped like `template` (numpy leaves)."""
    def convert(path, leaf):
        array = np.asarray(arrays[hf_name(path)], dtype=np.float32)
        return np.ascontiguousarray(array.T) if _is_kernel(path) else array

    return jax.tree_util.tree_map_with_path(convert, template)


def to_hf(tree: Any) -> dict[str, np.ndarray]:
    """A Flax parameter tree (parameters or Adam moments) -> HF-named float32 numpy arrays in torch layout."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {hf_name(path): np.ascontiguousarray(np.asarray(leaf, dtype=np.float32).T if _is_kernel(path)
                                                else np.asarray(leaf, dtype=np.float32))
            for path, leaf in flat}

"""The BERT-family sequence classifier in Keras 3 layers (TensorFlow backend), loaded from HF parameter names.

The network is HF `BertForSequenceClassification` (post-LayerNorm BERT): embeddings (word + position + token type,
LayerNorm, dropout), `num_hidden_layers` encoder blocks (self-attention with an additive mask, output dense,
residual LayerNorm; GELU feed-forward, residual LayerNorm), pooler `tanh(dense(h[:, 0]))`, dropout, classifier.

Dropout is stateless: every dropout site draws its mask from `tf.random.stateless_uniform` with a seed derived from
the `seed` argument, so a step is a pure function of (variables, batch, seed). That keeps XLA compilation, replicas
and exact resume simple (the train step derives the seed from the optimizer step and the replica).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402  (the backend must be chosen before Keras is imported)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tpuplex.errors import TpuplexError  # noqa: E402

if keras.backend.backend() != "tensorflow":
    raise TpuplexError(
        f"Keras runs on the {keras.backend.backend()!r} backend, but tpuplex-tf needs TensorFlow: "
        "set KERAS_BACKEND=tensorflow (or unset it) before starting"
    )

_ACTIVATIONS = {
    "gelu": lambda x: tf.nn.gelu(x, approximate=False),  # HF "gelu" is the exact erf form
    "gelu_new": lambda x: tf.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: tf.nn.gelu(x, approximate=True),
    "relu": tf.nn.relu,
}


def _dropout(x: tf.Tensor, rate: float, seed: tf.Tensor | None, site: int) -> tf.Tensor:
    """Inverted dropout with a stateless mask; identity when `seed` is None or the rate is 0.

    seed: int32 [2]; `site` makes each dropout location draw an independent mask.
    """
    if seed is None or rate == 0.0:
        return x
    site_seed = tf.random.experimental.stateless_fold_in(seed, site)
    keep = tf.random.stateless_uniform(tf.shape(x), seed=site_seed, dtype=x.dtype) >= rate
    return tf.where(keep, x / (1.0 - rate), tf.zeros_like(x))


class _EncoderLayer(keras.layers.Layer):
    """One BERT block: [B, L, H] -> [B, L, H]."""

    def __init__(self, config: Mapping[str, Any], **kwargs):
        super().__init__(**kwargs)
        hidden, eps = int(config["hidden_size"]), float(config.get("layer_norm_eps", 1e-12))
        self.heads = int(config["num_attention_heads"])
        self.head_size = hidden // self.heads
        self.attention_dropout = float(config.get("attention_probs_dropout_prob", 0.0))
        self.hidden_dropout = float(config.get("hidden_dropout_prob", 0.0))
        self.activation = _ACTIVATIONS[config.get("hidden_act", "gelu")]
        self.query = keras.layers.Dense(hidden, name="query")
        self.key = keras.layers.Dense(hidden, name="key")
        self.value = keras.layers.Dense(hidden, name="value")
        self.attention_output = keras.layers.Dense(hidden, name="attention_output")
        self.attention_norm = keras.layers.LayerNormalization(epsilon=eps, name="attention_norm")
        self.intermediate = keras.layers.Dense(int(config["intermediate_size"]), name="intermediate")
        self.output_dense = keras.layers.Dense(hidden, name="output_dense")
        self.output_norm = keras.layers.LayerNormalization(epsilon=eps, name="output_norm")

    def _split_heads(self, x: tf.Tensor) -> tf.Tensor:
        """[B, L, H] -> [B, heads, L, head_size]."""
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        return tf.transpose(tf.reshape(x, [batch, length, self.heads, self.head_size]), [0, 2, 1, 3])

    def call(self, hidden: tf.Tensor, mask_bias: tf.Tensor, seed: tf.Tensor | None, site: int) -> tf.Tensor:
        """hidden [B, L, H]; mask_bias [B, 1, 1, L] (0 for real keys, the dtype's min for padding)."""
        query, key, value = (self._split_heads(f(hidden)) for f in (self.query, self.key, self.value))
        scores = tf.matmul(query, key, transpose_b=True) / np.sqrt(self.head_size).astype(np.float32)
        probs = _dropout(tf.nn.softmax(scores + mask_bias, axis=-1), self.attention_dropout, seed, site)
        context = tf.transpose(tf.matmul(probs, value), [0, 2, 1, 3])  # [B, L, heads, head_size]
        context = tf.reshape(context, tf.shape(hidden))
        attended = _dropout(self.attention_output(context), self.hidden_dropout, seed, site + 1)
        hidden = self.attention_norm(hidden + attended)
        inner = self.activation(self.intermediate(hidden))
        out = _dropout(self.output_dense(inner), self.hidden_dropout, seed, site + 2)
        return self.output_norm(hidden + out)


class BertClassifier(keras.Model):
    """`BertForSequenceClassification` in Keras layers: (input_ids, token_type_ids, attention_mask) -> logits.

    Inputs are int32 [B, L]; the output is float32 [B, num_labels].
    """

    DROPOUT_SITES_PER_LAYER = 3

    def __init__(self, config: Mapping[str, Any], num_labels: int, dropout: bool, **kwargs):
        super().__init__(**kwargs)
        activation = config.get("hidden_act", "gelu")
        if activation not in _ACTIVATIONS:
            raise TpuplexError(
                f"hidden_act {activation!r} in the checkpoint's config.json is not supported by tpuplex-tf: "
                f"use a checkpoint with one of {', '.join(_ACTIVATIONS)}"
            )
        hidden, eps = int(config["hidden_size"]), float(config.get("layer_norm_eps", 1e-12))
        self.dropout_enabled = dropout
        self.hidden_dropout = float(config.get("hidden_dropout_prob", 0.0))
        classifier_dropout = config.get("classifier_dropout")
        self.classifier_dropout = self.hidden_dropout if classifier_dropout is None else float(classifier_dropout)
        self.word_embeddings = keras.layers.Embedding(int(config["vocab_size"]), hidden, name="word_embeddings")
        self.position_embeddings = keras.layers.Embedding(
            int(config["max_position_embeddings"]), hidden, name="position_embeddings")
        self.token_type_embeddings = keras.layers.Embedding(
            int(config["type_vocab_size"]), hidden, name="token_type_embeddings")
        self.embedding_norm = keras.layers.LayerNormalization(epsilon=eps, name="embedding_norm")
        self.encoder = [_EncoderLayer(config, name=f"layer_{i}") for i in range(int(config["num_hidden_layers"]))]
        self.pooler = keras.layers.Dense(hidden, activation="tanh", name="pooler")
        self.classifier = keras.layers.Dense(num_labels, name="classifier")

    def call(self, input_ids, token_type_ids, attention_mask, seed: tf.Tensor | None = None) -> tf.Tensor:
        """Logits [B, num_labels]. `seed` (int32 [2]) turns dropout on when the model was built with dropout."""
        seed = seed if self.dropout_enabled else None
        positions = tf.range(tf.shape(input_ids)[1])[None, :]
        hidden = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
                  + self.token_type_embeddings(token_type_ids))
        hidden = _dropout(self.embedding_norm(hidden), self.hidden_dropout, seed, 0)
        # HF's extended attention mask: 0 where attended, the dtype's minimum on padded keys.
        mask_bias = (1.0 - tf.cast(attention_mask, hidden.dtype))[:, None, None, :] * hidden.dtype.min
        for index, layer in enumerate(self.encoder):
            hidden = layer(hidden, mask_bias, seed=seed, site=1 + self.DROPOUT_SITES_PER_LAYER * index)
        pooled = _dropout(self.pooler(hidden[:, 0]), self.classifier_dropout, seed, -1)
        return self.classifier(pooled)

    def hf_variables(self) -> dict[str, tuple[keras.Variable, bool]]:
        """HF parameter name -> (Keras variable, whether the variable is the transpose of the HF tensor).

        Dense kernels are [in, out] where torch Linear weights are [out, in]; everything else has the same layout.
        """
        def dense(prefix: str, layer: keras.layers.Dense) -> dict[str, tuple[keras.Variable, bool]]:
            return {f"{prefix}.weight": (layer.kernel, True), f"{prefix}.bias": (layer.bias, False)}

        def norm(prefix: str, layer: keras.layers.LayerNormalization) -> dict[str, tuple[keras.Variable, bool]]:
            return {f"{prefix}.weight": (layer.gamma, False), f"{prefix}.bias": (layer.beta, False)}

        names = {
            "bert.embeddings.word_embeddings.weight": (self.word_embeddings.embeddings, False),
            "bert.embeddings.position_embeddings.weight": (self.position_embeddings.embeddings, False),
            "bert.embeddings.token_type_embeddings.weight": (self.token_type_embeddings.embeddings, False),
            **norm("bert.embeddings.LayerNorm", self.embedding_norm),
        }
        for index, layer in enumerate(self.encoder):
            prefix = f"bert.encoder.layer.{index}"
            names |= dense(f"{prefix}.attention.self.query", layer.query)
            names |= dense(f"{prefix}.attention.self.key", layer.key)
            names |= dense(f"{prefix}.attention.self.value", layer.value)
            names |= dense(f"{prefix}.attention.output.dense", layer.attention_output)
            names |= norm(f"{prefix}.attention.output.LayerNorm", layer.attention_norm)
            names |= dense(f"{prefix}.intermediate.dense", layer.intermediate)
            names |= dense(f"{prefix}.output.dense", layer.output_dense)
            names |= norm(f"{prefix}.output.LayerNorm", layer.output_norm)
        names |= dense("bert.pooler.dense", self.pooler)
        names |= dense("classifier", self.classifier)
        return names


def build(config: Mapping[str, Any], num_labels: int, dropout: bool) -> BertClassifier:
    """Create the classifier and its variables (call under the strategy's scope so they are distributed)."""
    model = BertClassifier(config, num_labels, dropout)
    ones = tf.ones([1, 2], tf.int32)
    model(ones, ones * 0, ones)  # creates every variable
    return model


def swap_layout(array: np.ndarray, transposed: bool) -> np.ndarray:
    """HF (torch) layout <-> Keras layout of one variable: a transpose for Dense kernels, else unchanged."""
    return np.ascontiguousarray(array.T) if transposed else array

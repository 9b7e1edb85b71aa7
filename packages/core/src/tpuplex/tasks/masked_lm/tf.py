"""Masked-LM pre-training in Keras (TensorFlow): the MLM head on the masked positions (decoder tied to the word
embeddings), their cross-entropy, and the SavedModel's serving outputs."""

from __future__ import annotations

import keras
import tensorflow as tf

from tpuplex.layers.tf import ACTIVATIONS, Variables, dense_variables, norm_variables
from tpuplex.models import Architecture
from tpuplex.tasks import tf as tasks_tf
from tpuplex.tasks.masked_lm.heads import MaskedLMHead


class Head(keras.layers.Layer):
    """The hidden states [B, L, H] at `masked_positions` [B, P] (every position without them) -> dense H->E ->
    activation -> LayerNorm -> word embeddings^T + bias -> logits [B, P, V]."""

    def __init__(self, head: MaskedLMHead, word_embeddings: keras.Variable, **kwargs):
        super().__init__(**kwargs)
        self.spec, self.word = head, word_embeddings
        self.transform = keras.layers.Dense(head.embedding_size, name="transform")
        self.norm = keras.layers.LayerNormalization(epsilon=head.layer_norm_eps, name="norm")
        self.bias = self.add_weight(shape=(head.vocab_size,), initializer="zeros", name="bias")

    def call(self, hidden: tf.Tensor, seed: tf.Tensor | None, masked_positions: tf.Tensor | None = None) -> tf.Tensor:
        if masked_positions is not None:
            hidden = tf.gather(hidden, masked_positions, batch_dims=1)
        x = self.norm(ACTIVATIONS[self.spec.activation](self.transform(hidden)))
        return tf.einsum("ble,ve->blv", x, self.word) + self.bias

    def canonical_variables(self) -> Variables:
        return {**dense_variables("head.transform", self.transform), **norm_variables("head.norm", self.norm),
                "head.bias": (self.bias, False)}


class Module(tasks_tf.TaskModule):
    def build_head(self, arch: Architecture, head: MaskedLMHead, word_embeddings: keras.Variable) -> Head:
        return Head(head, word_embeddings, name="head")

    def unit_losses(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """Per-position cross-entropy [B, P] of logits [B, P, V] against the original ids."""
        return tasks_tf.token_losses(outputs, batch["labels"])

    def predict_outputs(self, outputs: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """float32 [B, P, 2]: each position's cross-entropy and 1.0 where the most likely token is the label."""
        return tasks_tf.token_outputs(outputs, batch["labels"])

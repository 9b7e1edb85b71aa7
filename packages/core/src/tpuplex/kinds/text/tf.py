"""Text encoder families in Keras 3 layers (TensorFlow), built from the core's `Architecture` with the task's head.

One layer per concept (`_Embeddings`, `_Block`), assembled with the task's head layer
(`tpuplex.tasks.tf.TaskModule.build_head`) by `TaskModel` for any supported family (see `tpuplex.models`):
embeddings (+ projection), post-LayerNorm blocks applied in `arch.block_schedule` order (ALBERT calls one block
several times), then the head. Each layer names its variables canonically; `TaskModel.hf_variables` maps them to
HF names. Dropout is stateless (`tpuplex.layers.tf.dropout`).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tpuplex.errors import TpuplexError
from tpuplex.kinds.tf import Built, KindModule
from tpuplex.layers.tf import ACTIVATIONS, Variables, dense_variables, dropout, norm_variables
from tpuplex.models import Architecture, Family
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex.tasks.base import Head


class _Embeddings(keras.layers.Layer):
    """[B, L] ids -> [B, L, hidden]: word + position (+ token type) embeddings, LayerNorm, dropout, projection."""

    def __init__(self, arch: Architecture, **kwargs):
        super().__init__(**kwargs)
        self.arch = arch
        embed = lambda rows, name: keras.layers.Embedding(rows, arch.embedding_size, name=name)  # noqa: E731
        self.word, self.position = embed(arch.vocab_size, "word"), embed(arch.max_positions, "position")
        self.token_type = embed(arch.type_vocab_size, "token_type") if arch.type_vocab_size else None
        self.norm = keras.layers.LayerNormalization(epsilon=arch.layer_norm_eps, name="norm")
        self.projection = keras.layers.Dense(arch.hidden_size, name="projection") if arch.embedding_projection \
            else None

    def build_word_table(self) -> None:
        """Create the word embedding table now, so a tied head can hold it before the first call."""
        self.word.build((None, None))

    def call(self, input_ids: tf.Tensor, token_type_ids: tf.Tensor, seed: tf.Tensor | None) -> tf.Tensor:
        positions = tf.range(tf.shape(input_ids)[1])[None, :] + self.arch.position_offset
        hidden = self.word(input_ids) + self.position(positions)
        if self.token_type is not None:
            # Families without segments (RoBERTa) add type 0 everywhere, as HF's default token_type_ids do.
            segments = token_type_ids if self.arch.token_types else tf.zeros_like(input_ids)
            hidden += self.token_type(segments)
        hidden = dropout(self.norm(hidden), self.arch.embedding_dropout, seed, 0)
        return hidden if self.projection is None else self.projection(hidden)

    def canonical_variables(self) -> Variables:
        found = {"embeddings.word.weight": (self.word.embeddings, False),
                 "embeddings.position.weight": (self.position.embeddings, False),
                 **norm_variables("embeddings.norm", self.norm)}
        if self.token_type is not None:
            found["embeddings.token_type.weight"] = (self.token_type.embeddings, False)
        if self.projection is not None:
            found |= dense_variables("embeddings.projection", self.projection)
        return found


class _Block(keras.layers.Layer):
    """A post-LayerNorm transformer block: [B, L, H] -> [B, L, H]."""

    DROPOUT_SITES = 3

    def __init__(self, arch: Architecture, **kwargs):
        super().__init__(**kwargs)
        self.arch = arch
        self.head_size = arch.hidden_size // arch.num_heads
        self.activation = ACTIVATIONS[arch.hidden_act]
        dense = lambda units, name: keras.layers.Dense(units, name=name)  # noqa: E731
        norm = lambda name: keras.layers.LayerNormalization(epsilon=arch.layer_norm_eps, name=name)  # noqa: E731
        self.query, self.key, self.value = dense(arch.hidden_size, "query"), dense(arch.hidden_size, "key"), \
            dense(arch.hidden_size, "value")
        self.attention_output, self.attention_norm = dense(arch.hidden_size, "attention_output"), \
            norm("attention_norm")
        self.intermediate = dense(arch.intermediate_size, "intermediate")
        self.output_dense, self.output_norm = dense(arch.hidden_size, "output"), norm("output_norm")

    def _split_heads(self, x: tf.Tensor) -> tf.Tensor:
        """[B, L, H] -> [B, heads, L, head_size]."""
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        return tf.transpose(tf.reshape(x, [batch, length, self.arch.num_heads, self.head_size]), [0, 2, 1, 3])

    def call(self, hidden: tf.Tensor, mask_bias: tf.Tensor, seed: tf.Tensor | None, site: int) -> tf.Tensor:
        """hidden [B, L, H]; mask_bias [B, 1, 1, L] (0 for real keys, the dtype's min for padding); `site` is the
        first dropout site of this application of the block."""
        a = self.arch
        query, key, value = (self._split_heads(f(hidden)) for f in (self.query, self.key, self.value))
        scores = tf.matmul(query, key, transpose_b=True) / np.sqrt(self.head_size).astype(np.float32)
        probs = dropout(tf.nn.softmax(scores + mask_bias, axis=-1), a.attention_dropout, seed, site)
        context = tf.reshape(tf.transpose(tf.matmul(probs, value), [0, 2, 1, 3]), tf.shape(hidden))
        attended = dropout(self.attention_output(context), a.attention_output_dropout, seed, site + 1)
        hidden = self.attention_norm(hidden + attended)
        inner = self.activation(self.intermediate(hidden))
        out = dropout(self.output_dense(inner), a.ffn_output_dropout, seed, site + 2)
        return self.output_norm(hidden + out)

    def canonical_variables(self, index: int) -> Variables:
        prefix = f"block.{index}"
        return {**dense_variables(f"{prefix}.query", self.query), **dense_variables(f"{prefix}.key", self.key),
                **dense_variables(f"{prefix}.value", self.value),
                **dense_variables(f"{prefix}.attention_output", self.attention_output),
                **norm_variables(f"{prefix}.attention_norm", self.attention_norm),
                **dense_variables(f"{prefix}.intermediate", self.intermediate),
                **dense_variables(f"{prefix}.output", self.output_dense),
                **norm_variables(f"{prefix}.output_norm", self.output_norm)}


class TaskModel(keras.Model):
    """The family's encoder in Keras layers with the task's head (`tpuplex.tasks`): (input_ids, token_type_ids,
    attention_mask) int32 [B, L] -> the head's outputs. `head_layer(word_embeddings)` builds the head, given the
    word embedding table (tied decoders read it)."""

    def __init__(self, family: Family, arch: Architecture, head: Head, head_layer, **kwargs):
        super().__init__(**kwargs)
        self.family, self.arch, self.head_spec = family, arch, head
        self.embeddings = _Embeddings(arch, name="embeddings")
        self.blocks = [_Block(arch, name=f"block_{index}") for index in range(arch.num_blocks)]
        self.embeddings.build_word_table()
        self.head = head_layer(self.embeddings.word.embeddings)

    def call(self, input_ids, token_type_ids, attention_mask, seed: tf.Tensor | None = None,
             **head_inputs: tf.Tensor) -> tf.Tensor:
        """The head's outputs; `seed` (int32 [2]) turns dropout on (rates are 0 when built without it);
        `head_inputs` (the batch's further entries, `tpuplex.protocol.head_inputs`) go to the head."""
        hidden = self.embeddings(input_ids, token_type_ids, seed)
        # HF's extended attention mask: 0 where attended, the dtype's minimum on padded keys.
        mask_bias = (1.0 - tf.cast(attention_mask, hidden.dtype))[:, None, None, :] * hidden.dtype.min
        for applied, index in enumerate(self.arch.block_schedule):
            hidden = self.blocks[index](hidden, mask_bias, seed=seed, site=1 + _Block.DROPOUT_SITES * applied)
        return self.head(hidden, seed, **head_inputs)

    def state_variables(self) -> dict[str, keras.Variable]:
        """The encoder and its heads have no non-trainable state."""
        return {}

    def hf_variables(self) -> Variables:
        """HF parameter name -> (Keras variable, whether it is the transpose of the HF tensor).

        Dense kernels are [in, out] where torch Linear weights are [out, in]; everything else has the same layout.
        A tied variable (the MLM decoder) is listed once, under the name of the parameter it is.
        """
        canonical = self.embeddings.canonical_variables()
        for index, block in enumerate(self.blocks):
            canonical |= block.canonical_variables(index)
        named = {self.family.hf_name(name, self.arch): found for name, found in canonical.items()}
        return named | {self.head_spec.hf_name(name): found for name, found in self.head.canonical_variables().items()}


class TextEncoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        """Create the model and its variables (called under the strategy's scope, so they are distributed)."""
        if optimizer.bf16:
            raise TpuplexError("train.bf16 = true is supported by the tf backend for the image families (ResNet, "
                               "ViT) only so far: set train.bf16 = false (or use the jax or torch backend)")
        arch, head = (spec.arch, spec.head) if spec.dropout else (spec.arch.without_dropout(),
                                                                  spec.head.without_dropout())
        model = TaskModel(spec.family, arch, head, lambda word: task.build_head(arch, head, word))
        ones = tf.ones([1, 2], tf.int32)
        model(ones, ones * 0, ones)  # creates every variable
        return Built(model, spec.params, {})

"""An encoder in Keras 3 layers (TensorFlow backend), built from the core's `Architecture`, with a task's head.

One layer per concept (`_Embeddings`, `_Block`), assembled with the task's head layer (`tpuplex.tasks`) by
`TaskModel` for any supported family (see `tpuplex.models`): embeddings (+ projection), post-LayerNorm blocks
applied in `arch.block_schedule` order (ALBERT calls one block several times), then the head. Each layer names
its variables canonically; `TaskModel.hf_variables` maps them to HF names.

Dropout is stateless: every dropout site draws its mask from `tf.random.stateless_uniform` with a seed derived from
the `seed` argument, so a step is a pure function of (variables, batch, seed). That keeps XLA compilation, replicas
and exact resume simple (the train step derives the seed from the optimizer step and the replica).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402  (the backend must be chosen before Keras is imported)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tpuplex import models  # noqa: E402
from tpuplex.errors import TpuplexError  # noqa: E402
from tpuplex.models import Architecture, Family, user  # noqa: E402
from tpuplex.protocol import ModelSpec  # noqa: E402
from tpuplex.tasks import Head  # noqa: E402

if keras.backend.backend() != "tensorflow":
    raise TpuplexError(
        f"Keras runs on the {keras.backend.backend()!r} backend, but tpuplex-tf needs TensorFlow: "
        "set KERAS_BACKEND=tensorflow (or unset it) before starting"
    )

Variables = dict[str, tuple[keras.Variable, bool]]
"""Canonical (or HF) name -> (variable, whether it is a kernel in Keras' layout: Dense [in, out], Conv2D HWIO,
where torch has [out, in] and OIHW; see `tpuplex.params.to_torch_layout`)."""

ACTIVATIONS = {
    "gelu": lambda x: tf.nn.gelu(x, approximate=False),  # HF "gelu" is the exact erf form
    "gelu_new": lambda x: tf.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: tf.nn.gelu(x, approximate=True),
    "relu": tf.nn.relu,
    "tanh": tf.math.tanh,
}


def dropout(x: tf.Tensor, rate: float, seed: tf.Tensor | None, site: int) -> tf.Tensor:
    """Inverted dropout with a stateless mask; identity when `seed` is None or the rate is 0.

    seed: int32 [2]; `site` makes each dropout location draw an independent mask.
    """
    if seed is None or rate == 0.0:
        return x
    site_seed = tf.random.experimental.stateless_fold_in(seed, site)
    keep = tf.random.stateless_uniform(tf.shape(x), seed=site_seed, dtype=x.dtype) >= rate
    # The scale goes on the mask, so x is read once forward and once backward; the same bits as
    # tf.where(keep, x / (1 - rate), 0), which Grappler turns into a multiply by the float32 reciprocal anyway.
    return x * (tf.cast(keep, x.dtype) * (1.0 / (1.0 - rate)))


def dense_variables(module: str, layer: keras.layers.Dense) -> Variables:
    return {f"{module}.weight": (layer.kernel, True), f"{module}.bias": (layer.bias, False)}


def norm_variables(module: str, layer: keras.layers.LayerNormalization) -> Variables:
    return {f"{module}.weight": (layer.gamma, False), f"{module}.bias": (layer.beta, False)}


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


def build(spec: ModelSpec, task: ModuleType) -> TaskModel:
    """Create the model and its variables (call under the strategy's scope so they are distributed)."""
    family, arch = models.architecture_of(spec.hf_config)
    arch, head = (arch, spec.head) if spec.dropout else (arch.without_dropout(), spec.head.without_dropout())
    model = TaskModel(family, arch, head, lambda word: task.head_layer(arch, head, word, name="head"))
    ones = tf.ones([1, 2], tf.int32)
    model(ones, ones * 0, ones)  # creates every variable
    return model


class UserClassifier:
    """A user's Keras model (`model.architecture`, see `tpuplex.models.user`) behind the interface `Steps` drives.

    Its variables keep their Keras layout and are named by the attributes that reach them, as torch's state dict
    names them (`convolutions.0.kernel`): Keras' own paths carry per-process counters (`text_cnn_2/conv1d_7`), so
    they could not name a checkpoint another process reads. In a train step the model runs with `training=True`
    (batch norm on the batch's statistics); with dropout off its Dropout layers have rate 0 (`build_user_model`).
    Every Keras seed generator in it is set from the step's seed first, so its dropout masks, like the built-in
    classifier's, depend only on (seed, step, replica): a resumed run draws the same ones.
    """

    def __init__(self, module: keras.Model):
        self.module = module
        self.seed_states = [v for v in module.non_trainable_variables if v.path.endswith("seed_generator_state")]

    def __call__(self, *inputs: tf.Tensor, seed: tf.Tensor | None = None) -> tf.Tensor:
        training = seed is not None
        if training:
            for index, state in enumerate(self.seed_states):
                state.assign(tf.cast(tf.random.experimental.stateless_fold_in(seed, 1000 + index), state.dtype))
        return self.module(*inputs, training=training)

    def hf_variables(self) -> Variables:
        """Attribute path -> (variable, False) for every trainable variable (user models keep their layout)."""
        named = _attribute_paths(self.module, trainable=True)
        unnamed = [v.path for v in self.module.trainable_variables if id(v) not in {id(x) for x in named.values()}]
        if unnamed:
            raise TpuplexError(f"the Keras model has trainable variables no attribute reaches ({', '.join(unnamed)}): "
                               "assign every layer to an attribute (or a list attribute) of the model")
        return {name: (variable, False) for name, variable in named.items()}

    def state_variables(self) -> dict[str, keras.Variable]:
        """Attribute path -> every non-trainable variable but the seed generators' (batch-norm moving statistics):
        the model's state, which training updates and checkpoints carry."""
        seeds = {id(v) for v in self.seed_states}
        return {name: v for name, v in _attribute_paths(self.module, trainable=False).items() if id(v) not in seeds}


def _attribute_paths(layer: keras.layers.Layer, trainable: bool, prefix: str = "") -> dict[str, keras.Variable]:
    """The (non-)trainable variables of `layer` and its sublayers, named by attribute path; a shared layer once."""
    own = layer._trainable_variables if trainable else layer._non_trainable_variables  # not its sublayers'
    found = {f"{prefix}{v.name}": v for v in own}
    for attribute, value in vars(layer).items():
        if attribute.startswith("_"):
            continue
        children = [(attribute, value)] if isinstance(value, keras.layers.Layer) else \
            [(f"{attribute}.{i}", item) for i, item in enumerate(value) if isinstance(item, keras.layers.Layer)] \
            if isinstance(value, list | tuple) else []
        for name, child in children:
            for path, variable in _attribute_paths(child, trainable, f"{prefix}{name}.").items():
                if all(variable is not seen for seen in found.values()):
                    found[path] = variable
    return found


def build_user_model(spec: ModelSpec, seed: int, model_inputs: Callable) -> UserClassifier:
    """The user's Keras model with variables drawn under `keras.utils.set_random_seed(seed)`, checked to return
    logits [B, num_labels] for `model_inputs(batch)` (call under the strategy's scope); with dropout off, every
    Dropout layer in it gets rate 0, as the torch backend sets p = 0."""
    keras.utils.set_random_seed(seed)
    module = user.build(spec.architecture, "tf", spec.model_arguments, keras.layers.Layer, "keras.layers.Layer")
    example = {key: tf.constant(value) for key, value in user.example_batch(spec.model_arguments).items()}
    logits = module(*model_inputs(example))  # creates every variable
    shape = tuple(logits.shape) if hasattr(logits, "shape") else type(logits).__name__
    user.check_logits(spec.architecture, shape, 2, spec.num_labels)
    if not spec.dropout:
        for layer in module._flatten_layers():
            if isinstance(layer, keras.layers.Dropout):
                layer.rate = 0.0
    return UserClassifier(module)


def text_inputs(batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, ...]:
    """What a text model is called with: input_ids, token_type_ids, attention_mask int32 [B, L]."""
    return batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]


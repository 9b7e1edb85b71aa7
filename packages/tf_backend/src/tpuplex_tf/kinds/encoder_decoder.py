"""T5 in Keras (TensorFlow): the parameters as variables under their HF names in the portable layout, run by the
forward pass written once (`tpuplex.models.t5`) over TensorFlow's table of operations (`tpuplex_tf.ops.TfOps`),
dropout stateless from `seed`. `generate` encodes once and runs one XLA-compiled decoder step per token
(`tpuplex.models.search`), the self-attention cache reordered by the search inside that step.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import tensorflow as tf

from tpuplex.kinds.encoder_decoder import parameter_names, parameter_shapes
from tpuplex.models import search, t5
from tpuplex.models.t5 import T5Arch
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts
from tpuplex_tf.kinds import Built, KindModule
from tpuplex_tf.ops import TfOps, Variables


class T5Model(keras.Model):
    """(input_ids, attention_mask [B, S], decoder_input_ids [B, T]) -> next-token logits float32 [B, T, V]."""

    def __init__(self, arch: T5Arch, names: dict[str, str], shapes: dict[str, tuple[int, ...]], **kwargs):
        """names: canonical -> HF name of every parameter; shapes: HF name -> portable shape."""
        super().__init__(**kwargs)
        self.arch, self.names = arch, names
        self.named = {name: self.add_weight(shape=shapes[hf], initializer="zeros", name=hf.replace(".", "_"))
                      for name, hf in names.items()}

    def params(self) -> dict[str, tf.Tensor]:
        return {name: variable.value for name, variable in self.named.items()}

    def ops(self, seed: tf.Tensor | None = None) -> TfOps:
        return TfOps(seed, tf.as_dtype(self.compute_dtype))

    def call(self, input_ids, attention_mask, decoder_input_ids, seed: tf.Tensor | None = None):
        return t5.forward(self.ops(seed), self.params(), self.arch, input_ids, attention_mask, decoder_input_ids)

    def state_variables(self) -> dict[str, keras.Variable]:
        return {}

    def hf_variables(self) -> Variables:
        """HF parameter name -> (Keras variable, not transposed: every variable keeps the portable layout)."""
        return {self.names[name]: (variable, False) for name, variable in self.named.items()}


class EncoderDecoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        """Create the model and its variables (called under the strategy's scope, so they are distributed)."""
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        model = T5Model(arch, parameter_names(spec), parameter_shapes(spec))
        model(tf.ones([1, 2], tf.int32), tf.ones([1, 2], tf.int32), tf.ones([1, 2], tf.int32))  # built, for export
        return Built(model, spec.params, {})

    def generate(self, network: T5Model, prompts: Prompts) -> np.ndarray:
        """The inputs [B, S] through the encoder once, then `tpuplex.models.search` over one compiled decoder step
        a token."""
        arch, beams = network.arch, prompts.beams
        ids = tf.constant(np.repeat(np.asarray(prompts.ids, np.int32), beams, axis=0))
        mask = tf.constant(np.repeat(np.asarray(prompts.mask, np.int32), beams, axis=0))
        encode, step = _programs(network)
        cross = encode(ids, mask)
        shape = (int(ids.shape[0]), prompts.new_tokens, arch.num_heads, arch.head_dim)
        cache = tuple((tf.zeros(shape, network.compute_dtype),) * 2 for _ in range(arch.decoder_layers))

        def decode(tokens: np.ndarray, origin: np.ndarray, position: int) -> np.ndarray:
            nonlocal cache
            logits, cache = step(tf.constant(tokens, tf.int32), tf.constant(origin, tf.int32), cross, mask, cache,
                                 tf.constant(position, tf.int32))
            return logits.numpy().astype(np.float32)

        return search.generate(decode, prompts, arch.decoder_start_id, arch.eos_id, arch.pad_id)


@functools.lru_cache(maxsize=16)
def _programs(network: T5Model):
    """The compiled encoder (with every layer's cross-attention keys and values) and decoder step of `network`
    (by tracing, one per shape of their arguments); the step takes the cache from rows `origin` first."""
    def encode(ids, mask):
        ops, p, arch = network.ops(), network.params(), network.arch
        return t5.cross_keys(ops, p, arch, t5.encode(ops, p, arch, ids, mask))

    def step(tokens, origin, cross, mask, cache, position):
        cache = tf.nest.map_structure(lambda entry: tf.gather(entry, origin), cache)
        logits, cache = t5.decode(network.ops(), network.params(), network.arch, tokens[:, None], None, mask,
                                  cross=cross, cache=cache, cache_index=position)
        return logits[:, 0], cache

    return tf.function(encode, jit_compile=True), tf.function(step, jit_compile=True)

"""The decoder families in Keras (TensorFlow): the parameters as variables under their HF names in the portable
layout, run by the forward pass written once (`tpuplex.models.decoder.forward`) over TensorFlow's table of
operations (`tpuplex_tf.ops.TfOps`), dropout stateless from `seed`. `generate` runs the whole decoding loop in
one XLA-compiled `tf.function` per (prompt bucket, new tokens).
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import tensorflow as tf

from tpuplex.kinds.decoder import parameter_names, parameter_shapes
from tpuplex.models import decoder
from tpuplex.models.decoder import DecoderArch
from tpuplex.models.lora import Lora
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts
from tpuplex_tf.kinds import Built, KindModule
from tpuplex_tf.ops import TfOps, Variables


class DecoderModel(keras.Model):
    """input_ids int32 [B, T] -> next-token logits float32 [B, T, V]; with a cache, (logits, the updated cache)
    (`tpuplex.models.decoder.forward`'s arguments)."""

    def __init__(self, arch: DecoderArch, names: dict[str, str], shapes: dict[str, tuple[int, ...]],
                 lora: Lora | None = None, **kwargs):
        """names: canonical -> HF name of every parameter; shapes: HF name -> portable shape."""
        super().__init__(**kwargs)
        self.arch, self.lora, self.names = arch, lora, names
        self.named = {name: self.add_weight(shape=shapes[hf], initializer="zeros", name=hf.replace(".", "_"))
                      for name, hf in names.items()}

    def call(self, input_ids, seed: tf.Tensor | None = None, positions=None, cache=None, cache_index=0,
             key_mask=None, target_positions=None):
        params = {name: variable.value for name, variable in self.named.items()}
        ops = TfOps(seed, tf.as_dtype(self.compute_dtype))
        return decoder.forward(ops, params, self.arch, input_ids, lora=self.lora, positions=positions, cache=cache,
                               cache_index=cache_index, key_mask=key_mask, target_positions=target_positions)

    def state_variables(self) -> dict[str, keras.Variable]:
        return {}

    def hf_variables(self) -> Variables:
        """HF parameter name -> (Keras variable, not transposed: every variable keeps the portable layout)."""
        return {self.names[name]: (variable, False) for name, variable in self.named.items()}


def sample(logits: tf.Tensor, temperature: float, top_k: int, uniform: tf.Tensor) -> tf.Tensor:
    """int32 [B]: the most likely token of logits [B, V] (temperature 0), else the token where the CDF of
    softmax(logits / temperature), restricted to the top_k, first exceeds uniform [B]."""
    if temperature == 0:
        return tf.argmax(logits, axis=-1, output_type=tf.int32)
    scaled = logits / temperature
    if top_k:
        kth = tf.math.top_k(scaled, min(top_k, scaled.shape[-1])).values[:, -1:]
        scaled = tf.where(scaled < kth, -np.inf, scaled)
    cdf = tf.cumsum(tf.nn.softmax(scaled, axis=-1), axis=-1)
    chosen = tf.reduce_sum(tf.cast(cdf < uniform[:, None] * cdf[:, -1:], tf.int32), axis=-1)
    return tf.minimum(chosen, logits.shape[-1] - 1)


def decode(model: DecoderModel, ids: tf.Tensor, mask: tf.Tensor, uniforms: tf.Tensor, new_tokens: int,
           temperature: float, top_k: int, cache: bool) -> tf.Tensor:
    """int32 [B, N]: N tokens after the left-padded prompts ids, mask [B, P] (see `tpuplex.protocol.Prompts`)."""
    a = model.arch
    rows, length = tf.shape(ids)[0], ids.shape[1]
    total = length + new_tokens
    key_mask = tf.concat([mask, tf.ones([rows, new_tokens], mask.dtype)], axis=1)
    positions = tf.maximum(tf.cumsum(key_mask, axis=1) - 1, 0)
    pick = functools.partial(sample, temperature=temperature, top_k=top_k)
    tokens = tf.concat([ids, tf.zeros([rows, new_tokens], tf.int32)], axis=1)
    if cache:
        empty = tuple((tf.zeros([rows, total, a.num_kv_heads, a.head_dim], model.compute_dtype),) * 2
                      for _ in range(a.num_layers))
        logits, kv = model(ids, positions=positions[:, :length], cache=empty, cache_index=0, key_mask=key_mask)
    else:
        kv, logits = (), model(tokens, positions=positions, key_mask=key_mask)
    place = lambda index: tf.one_hot(index, total, dtype=tf.int32)[None, :]  # noqa: E731
    tokens += place(length) * pick(logits[:, length - 1], uniform=uniforms[:, 0])[:, None]

    def step(index, tokens, kv):
        at = length + index
        if cache:
            logits, kv = model(tokens[:, at : at + 1], positions=positions[:, at : at + 1], cache=kv,
                               cache_index=at, key_mask=key_mask)
            last = logits[:, 0]
        else:
            last = tf.gather(model(tokens, positions=positions, key_mask=key_mask), at, axis=1)
        chosen = pick(last, uniform=tf.gather(uniforms, index + 1, axis=1))
        return index + 1, tokens + place(at + 1) * chosen[:, None], kv

    _, tokens, _ = tf.while_loop(lambda index, *_: index < new_tokens - 1, step, (tf.constant(0), tokens, kv))
    return tokens[:, length:]


class Decoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        """Create the model and its variables (called under the strategy's scope, so they are distributed)."""
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        lora = spec.lora if spec.dropout or spec.lora is None else spec.lora.without_dropout()
        model = DecoderModel(arch, parameter_names(spec), parameter_shapes(spec), lora)
        model(tf.ones([1, 2], tf.int32))  # built, as Keras' export asks
        return Built(model, spec.params, {})

    def generate(self, network: DecoderModel, prompts: Prompts) -> np.ndarray:
        program = _programs(network, prompts.new_tokens, prompts.temperature, prompts.top_k, prompts.cache)
        return program(tf.constant(prompts.ids, tf.int32), tf.constant(prompts.mask, tf.int32),
                       tf.constant(prompts.uniforms, tf.float32)).numpy()


@functools.lru_cache(maxsize=16)
def _programs(network: DecoderModel, new_tokens: int, temperature: float, top_k: int, cache: bool):
    """One compiled decoding program per network and settings (and, by tracing, per prompt bucket)."""
    return tf.function(functools.partial(decode, network, new_tokens=new_tokens, temperature=temperature,
                                         top_k=top_k, cache=cache), jit_compile=True)

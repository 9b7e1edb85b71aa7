"""Decoder families in Keras 3 layers (TensorFlow), built from the core's `DecoderArch` (`tpuplex.models.decoder`).

One layer per concept (`_Block`), assembled by `DecoderModel`, whose `hf_variables` maps the canonical names to HF
names. The same call trains (causal attention over the rows, stateless dropout from `seed`) and decodes (a key/value
cache of S positions written at `cache_index`, a key mask for left-padded prompts); `generate` runs the whole
decoding loop in one XLA-compiled `tf.function` per (prompt bucket, new tokens).
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import tensorflow as tf

from tpuplex.kinds.tf import Built, KindModule
from tpuplex.layers.tf import ACTIVATIONS, Variables, dropout, norm_variables
from tpuplex.models.decoder import DecoderArch
from tpuplex.models.lora import PROJECTIONS, Lora
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts


def rotary(x: tf.Tensor, positions: tf.Tensor, theta: float) -> tf.Tensor:
    """HF Llama's rotary embedding of x [B, T, heads, D] at positions [B, T] (halves rotated, not pairs)."""
    half = x.shape[-1] // 2
    inverse = 1.0 / (theta ** (np.arange(0, half, dtype=np.float32) * 2 / x.shape[-1]))
    angles = tf.cast(positions, tf.float32)[..., None] * inverse
    cos, sin = (tf.cast(tf.concat([f(angles)] * 2, axis=-1)[:, :, None, :], x.dtype) for f in (tf.cos, tf.sin))
    return x * cos + tf.concat([-x[..., half:], x[..., :half]], axis=-1) * sin


def _norm(arch: DecoderArch, name: str) -> keras.layers.Layer:
    if arch.rms_norm:
        return keras.layers.RMSNormalization(epsilon=arch.norm_eps, name=name)
    return keras.layers.LayerNormalization(epsilon=arch.norm_eps, center=arch.norm_bias, name=name)


def _norm_variables(module: str, layer: keras.layers.Layer) -> Variables:
    if isinstance(layer, keras.layers.RMSNormalization):
        return {f"{module}.weight": (layer.scale, False)}
    if not layer.center:
        return {f"{module}.weight": (layer.gamma, False)}
    return norm_variables(module, layer)


class _Block(keras.layers.Layer):
    """A pre-norm decoder block: [B, T, H] -> ([B, T, H], this layer's updated cache entry or None)."""

    DROPOUT_SITES = 3

    def __init__(self, arch: DecoderArch, index: int, lora: Lora | None = None, **kwargs):
        super().__init__(**kwargs)
        self.arch, self.index, self.lora = arch, index, lora
        a = arch
        dense = lambda units, bias, name: keras.layers.Dense(units, use_bias=bias, name=name)  # noqa: E731
        heads, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        self.attention_norm, self.mlp_norm = _norm(a, "attention_norm"), _norm(a, "mlp_norm")
        if a.fused_qkv:
            self.projections = {"qkv": dense(heads + 2 * kv, a.attention_bias, "qkv")}
        else:
            self.projections = {name: dense(units, a.attention_bias, name)
                                for name, units in (("query", heads), ("key", kv), ("value", kv))}
        self.attention_output = dense(a.hidden_size, a.attention_bias, "attention_output")
        self.mlp = {name: dense(units, a.mlp_bias, name) for name, units in
                    (("gate", a.intermediate_size), ("up", a.intermediate_size), ("down", a.hidden_size))
                    if name != "gate" or a.gated_mlp}
        self.adapters: dict[str, tuple[keras.Variable, keras.Variable]] = {}
        """Projection -> its LoRA matrices (A [rank, in], B [out, rank], torch's layout in every family)."""
        if lora is not None:
            shapes = lora.canonical_shapes(arch)
            for name in (*self.projections, "attention_output", *self.mlp):
                module = f"block.{index}.{name}"
                if lora.adapts(module):
                    self.adapters[name] = tuple(
                        self.add_weight(shape=shapes[f"{module}.{matrix}.weight"], initializer="zeros",
                                        name=f"{name}_{matrix}") for matrix in ("lora_A", "lora_B"))

    def project(self, layer: keras.layers.Dense, h: tf.Tensor, seed: tf.Tensor | None) -> tf.Tensor:
        """The projection `layer`, with its LoRA adapter when it has one: + scale * B A dropout(h). The adapters'
        dropout draws at sites of their own (negative), so the base's masks do not move."""
        y = layer(h)
        if layer.name not in self.adapters:
            return y
        site = -(1 + self.index * len(PROJECTIONS) + PROJECTIONS.index(layer.name))
        a, b = self.adapters[layer.name]
        low = tf.matmul(dropout(h, self.lora.dropout, seed, site), tf.cast(a, h.dtype), transpose_b=True)
        return y + tf.matmul(low, tf.cast(b, h.dtype), transpose_b=True) * self.lora.scale

    def call(self, x: tf.Tensor, positions: tf.Tensor, mask: tf.Tensor, cache: tuple | None, cache_index,
             seed: tf.Tensor | None, site: int) -> tuple[tf.Tensor, tuple | None]:
        """mask [B or 1, T, S]: which keys each query sees; cache: (keys, values) [B, S, kv, D] or None; `site`
        the first dropout site of this block."""
        a = self.arch
        rows, length = tf.shape(x)[0], tf.shape(x)[1]
        heads, kv, size = a.num_heads, a.num_kv_heads, a.head_dim
        h = self.attention_norm(x)
        if a.fused_qkv:
            query, key, value = tf.split(self.project(self.projections["qkv"], h, seed),
                                         [heads * size, kv * size, kv * size], axis=-1)
        else:
            query, key, value = (self.project(self.projections[name], h, seed) for name in ("query", "key", "value"))
        query = tf.reshape(query, [rows, length, heads, size])
        key, value = tf.reshape(key, [rows, length, kv, size]), tf.reshape(value, [rows, length, kv, size])
        if a.rope_theta:
            query, key = rotary(query, positions, a.rope_theta), rotary(key, positions, a.rope_theta)
        if cache is not None:
            # Written as a blend with one-hot rows: a dynamic update XLA compiles at a static shape.
            written = tf.one_hot(cache_index + tf.range(length), tf.shape(cache[0])[1], dtype=key.dtype)  # [T, S]
            keep = (1.0 - tf.reduce_sum(written, axis=0))[None, :, None, None]
            key = cache[0] * keep + tf.einsum("ts,btkd->bskd", written, key)
            value = cache[1] * keep + tf.einsum("ts,btkd->bskd", written, value)
            cache = (key, value)
        # Grouped-query attention: query head h reads key/value head h // (heads / kv), as HF's repeat_kv.
        query = tf.reshape(query, [rows, length, kv, heads // kv, size])
        scores = tf.einsum("btkgd,bskd->bkgts", query, key) / np.sqrt(size).astype(np.float32)
        scores = tf.where(mask[:, None, None], scores, scores.dtype.min)
        probs = dropout(tf.nn.softmax(scores, axis=-1), a.attention_dropout, seed, site)
        context = tf.reshape(tf.einsum("bkgts,bskd->btkgd", probs, value), [rows, length, heads * size])
        x = x + dropout(self.project(self.attention_output, context, seed), a.residual_dropout, seed, site + 1)
        h = self.mlp_norm(x)
        inner = self.project(self.mlp["up"], h, seed)
        activation = ACTIVATIONS[a.activation]
        inner = activation(self.project(self.mlp["gate"], h, seed)) * inner if a.gated_mlp else activation(inner)
        return x + dropout(self.project(self.mlp["down"], inner, seed), a.residual_dropout, seed, site + 2), cache

    def canonical_variables(self, index: int) -> Variables:
        transposed = self.arch.kernel_layout == "out_in"
        found = {**_norm_variables(f"block.{index}.attention_norm", self.attention_norm),
                 **_norm_variables(f"block.{index}.mlp_norm", self.mlp_norm)}
        for name, layer in (*self.projections.items(), ("attention_output", self.attention_output),
                            *self.mlp.items()):
            found[f"block.{index}.{name}.weight"] = (layer.kernel, transposed)
            if layer.use_bias:
                found[f"block.{index}.{name}.bias"] = (layer.bias, False)
        for name, matrices in self.adapters.items():
            for matrix, variable in zip(("lora_A", "lora_B"), matrices, strict=True):
                found[f"block.{index}.{name}.{matrix}.weight"] = (variable, False)
        return found


class DecoderModel(keras.Model):
    """The decoder: input_ids int32 [B, T] -> next-token logits [B, T, V]; with a `cache` (each layer's keys and
    values over S positions, written from `cache_index`), `positions` [B, T] and `key_mask` [B, S], it returns
    (logits, updated cache)."""

    def __init__(self, family, arch: DecoderArch, lora: Lora | None = None, **kwargs):
        super().__init__(**kwargs)
        self.family, self.arch, self.lora = family, arch, lora
        self.word = keras.layers.Embedding(arch.vocab_size, arch.hidden_size, name="word")
        self.position = None if arch.rope_theta else keras.layers.Embedding(arch.max_positions, arch.hidden_size,
                                                                            name="position")
        self.blocks = [_Block(arch, index, lora, name=f"block_{index}") for index in range(arch.num_layers)]
        self.final_norm = _norm(arch, "final_norm")
        self.word.build((None, None))
        self.lm_head = None if arch.tied else self.add_weight(shape=(arch.vocab_size, arch.hidden_size),
                                                              initializer="zeros", name="lm_head")

    def call(self, input_ids, seed: tf.Tensor | None = None, positions=None, cache=None, cache_index=0,
             key_mask=None):
        length = tf.shape(input_ids)[1]
        if positions is None:
            positions = tf.broadcast_to(tf.range(length)[None, :], tf.shape(input_ids))
        x = self.word(input_ids)
        if self.position is not None:
            x = x + self.position(positions)
        x = dropout(x, self.arch.embedding_dropout, seed, 0)
        keys = length if cache is None else tf.shape(cache[0][0])[1]
        mask = (tf.range(keys)[None, :] <= cache_index + tf.range(length)[:, None])[None]
        if key_mask is not None:
            mask = tf.logical_and(mask, tf.cast(key_mask, tf.bool)[:, None, :])
        updated = []
        for index, block in enumerate(self.blocks):
            x, entry = block(x, positions, mask, cache=None if cache is None else cache[index],
                             cache_index=cache_index, seed=seed, site=1 + _Block.DROPOUT_SITES * index)
            updated.append(entry)
        x = self.final_norm(x)
        logits = tf.einsum("bth,vh->btv", x, self.word.embeddings if self.lm_head is None else self.lm_head)
        logits = tf.cast(logits, tf.float32)
        return logits if cache is None else (logits, tuple(updated))

    def state_variables(self) -> dict[str, keras.Variable]:
        return {}

    def hf_variables(self) -> Variables:
        """HF parameter name -> (Keras variable, whether it is the transpose of the HF tensor)."""
        canonical = {"embeddings.word.weight": (self.word.embeddings, False),
                     **_norm_variables("final_norm", self.final_norm)}
        if self.position is not None:
            canonical["embeddings.position.weight"] = (self.position.embeddings, False)
        if self.lm_head is not None:
            canonical["lm_head.weight"] = (self.lm_head, False)
        for index, block in enumerate(self.blocks):
            canonical |= block.canonical_variables(index)
        adapters = self.lora.hf_names() if self.lora else {}
        return {adapters.get(name) or self.family.hf_name(name): found for name, found in canonical.items()}


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
        empty = tuple((tf.zeros([rows, total, a.num_kv_heads, a.head_dim]),) * 2 for _ in range(a.num_layers))
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
        model = DecoderModel(spec.family, arch, lora)
        model(tf.ones([1, 2], tf.int32))  # creates every variable
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

"""Gemma 2 (`Gemma2ForCausalLM`): Llama's shape with RMSNorm scaled by 1 + weight, GeGLU (`hidden_activation`),
the word embeddings scaled by sqrt(hidden), a norm after the attention and after the MLP as well as before them,
scores scaled by `query_pre_attn_scalar` ** -0.5 and soft-capped, a sliding window on every other layer (the first
one slides), final logits soft-capped, the LM head tied."""

import math

from tpuplex.errors import TpuplexError
from tpuplex.models import llama
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.decoder import DecoderArch, DecoderFamily

DEFAULTS = {"num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
            "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
            "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": 30.0,
            "attn_logit_softcapping": 50.0, "use_bidirectional_attention": None}
"""The config.json keys Gemma 2 reads that may be absent, and `transformers.Gemma2Config`'s default for each."""


def soft_cap(config: ConfigReader, key: str) -> float:
    """A soft cap (0: none, as null gives), or transformers' default."""
    return 0.0 if config.config.get(key, DEFAULTS[key]) is None else config.get(key, float, DEFAULTS[key])


def read(config: ConfigReader) -> DecoderArch:
    if config.get("use_bidirectional_attention", bool, None):
        raise TpuplexError(f"use_bidirectional_attention = true in {config.path} is not supported: tpuplex builds "
                           "Gemma 2 as a causal decoder")
    layers = config.layers("num_hidden_layers")
    kinds = config.get("layer_types", list, None)
    if kinds is None:  # Gemma2Config's: the even layers slide
        kinds = ["sliding_attention" if index % 2 == 0 else "full_attention" for index in range(layers)]
    window = llama.sliding_window(config, DEFAULTS["sliding_window"])
    return llama.read_llama_like(
        config, "gemma2", DEFAULTS, activation=config.get("hidden_activation", str, DEFAULTS["hidden_activation"]),
        norm_offset=1.0, post_norms=True, embedding_scale=math.sqrt(config.positive("hidden_size")),
        windows=llama.sliding_windows(config, layers, window, kinds),
        attention_scale=config.get("query_pre_attn_scalar", float, DEFAULTS["query_pre_attn_scalar"]) ** -0.5,
        attention_softcap=soft_cap(config, "attn_logit_softcapping"),
        logit_softcap=soft_cap(config, "final_logit_softcapping"))


_LAYER = "model.layers.{block}"
GEMMA2 = DecoderFamily(
    model_types=("gemma2",), hf_class="Gemma2ForCausalLM",
    modules={**llama.MODULES, "block.attention_post_norm": f"{_LAYER}.post_attention_layernorm",
             "block.mlp_norm": f"{_LAYER}.pre_feedforward_layernorm",
             "block.mlp_post_norm": f"{_LAYER}.post_feedforward_layernorm"},
    read=read, peft_targets=("q_proj", "v_proj"))

"""Gemma 2 (`Gemma2ForCausalLM`): Llama's shape with RMSNorm scaled by 1 + weight, GeGLU (`hidden_activation`),
the word embeddings scaled by sqrt(hidden), a norm after the attention and after the MLP as well as before them,
scores scaled by `query_pre_attn_scalar` ** -0.5 and soft-capped, a sliding window on every other layer (the first
one slides), final logits soft-capped, the LM head tied."""

import math

from tpuplex.models import llama
from tpuplex.models.decoder import DecoderArch, DecoderFamily
from tpuplex.models.family import ConfigReader


def read(config: ConfigReader) -> DecoderArch:
    layers = config.layers("num_hidden_layers")
    if config.get("layer_types", list, None) is None:
        kinds = ["sliding_attention" if index % 2 == 0 else "full_attention" for index in range(layers)]
        config = ConfigReader({**config.config, "layer_types": kinds}, config.path)
    hidden = config.positive("hidden_size")
    head_dim = config.positive("head_dim", None) or hidden // config.positive("num_attention_heads")
    return llama.read_llama_like(
        config, "gemma2", activation=config.get("hidden_activation", str, "gelu_pytorch_tanh"),
        tied=config.get("tie_word_embeddings", bool, True), norm_offset=1.0, post_norms=True,
        embedding_scale=math.sqrt(hidden), windows=llama.sliding_windows(config, layers, everywhere=False),
        attention_scale=config.get("query_pre_attn_scalar", float, head_dim) ** -0.5,
        attention_softcap=config.get("attn_logit_softcapping", float, None) or 0.0,
        logit_softcap=config.get("final_logit_softcapping", float, None) or 0.0)


_LAYER = "model.layers.{block}"
GEMMA2 = DecoderFamily(
    model_types=("gemma2",), hf_class="Gemma2ForCausalLM",
    modules={**llama.MODULES, "block.attention_post_norm": f"{_LAYER}.post_attention_layernorm",
             "block.mlp_norm": f"{_LAYER}.pre_feedforward_layernorm",
             "block.mlp_post_norm": f"{_LAYER}.post_feedforward_layernorm"},
    read=read, peft_targets=("q_proj", "v_proj"))

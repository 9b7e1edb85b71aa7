"""Mistral (`MistralForCausalLM`): Llama with a sliding window of `sliding_window` keys on every layer (none when
it is null; transformers ignores `layer_types` here), no biases, and a head size of its own (`head_dim`)."""

from tpuplex.models import llama
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.decoder import DecoderArch, DecoderFamily

DEFAULTS = {"num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu", "max_position_embeddings": 4096 * 32,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_dropout": 0.0, "initializer_range": 0.02,
            "sliding_window": 4096}
"""The config.json keys Mistral reads that may be absent, and `transformers.MistralConfig`'s default for each."""


def read(config: ConfigReader) -> DecoderArch:
    window = llama.sliding_window(config, DEFAULTS["sliding_window"])
    return llama.read_llama_like(config, "mistral", DEFAULTS, windows=llama.sliding_windows(
        config, config.layers("num_hidden_layers"), window, None))


MISTRAL = DecoderFamily(model_types=("mistral",), hf_class="MistralForCausalLM", modules=llama.MODULES, read=read,
                        peft_targets=("q_proj", "v_proj"))

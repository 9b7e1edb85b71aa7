"""Qwen2 and Qwen2.5 (`Qwen2ForCausalLM`): Llama with biases on the query, key and value projections (none on the
output, none in the MLP), the LM head tied or not, and optionally a sliding window on the layers from
`max_window_layers` on."""

from tpuplex.models import llama
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.decoder import DecoderArch, DecoderFamily

DEFAULTS = {"num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False, "attention_dropout": 0.0, "initializer_range": 0.02,
            "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}
"""The config.json keys Qwen2 reads that may be absent, and `transformers.Qwen2Config`'s default for each."""


def read(config: ConfigReader) -> DecoderArch:
    layers = config.layers("num_hidden_layers")
    use_window = config.get("use_sliding_window", bool, DEFAULTS["use_sliding_window"])
    window = llama.sliding_window(config, DEFAULTS["sliding_window"]) if use_window else 0
    kinds = config.get("layer_types", list, None)
    if kinds is None:  # Qwen2Config's: the layers from max_window_layers on slide, when there is a window
        first = config.get("max_window_layers", int, DEFAULTS["max_window_layers"])
        kinds = ["sliding_attention" if window and index >= first else "full_attention" for index in range(layers)]
    return llama.read_llama_like(config, "qwen2", DEFAULTS, qkv_bias=True, output_bias=False,
                                 windows=llama.sliding_windows(config, layers, window, kinds))


QWEN2 = DecoderFamily(model_types=("qwen2",), hf_class="Qwen2ForCausalLM", modules=llama.MODULES, read=read,
                      peft_targets=("q_proj", "v_proj"))

"""Qwen2 and Qwen2.5 (`Qwen2ForCausalLM`): Llama with biases on the query, key and value projections (none on the
output), the LM head tied or not, and optionally a sliding window on the layers from `max_window_layers` on."""

from tpuplex.models import llama
from tpuplex.models.decoder import DecoderArch, DecoderFamily
from tpuplex.models.family import ConfigReader


def read(config: ConfigReader) -> DecoderArch:
    layers = config.layers("num_hidden_layers")
    if config.get("layer_types", list, None) is None and config.get("use_sliding_window", bool, False):
        first = config.get("max_window_layers", int, layers)
        kinds = ["sliding_attention" if index >= first else "full_attention" for index in range(layers)]
        config = ConfigReader({**config.config, "layer_types": kinds}, config.path)
    windows = llama.sliding_windows(config, layers, everywhere=False)
    return llama.read_llama_like(config, "qwen2", qkv_bias=True, output_bias=False, windows=windows)


QWEN2 = DecoderFamily(model_types=("qwen2",), hf_class="Qwen2ForCausalLM", modules=llama.MODULES, read=read,
                      peft_targets=("q_proj", "v_proj"))

"""Mistral (`MistralForCausalLM`): Llama with a sliding window of `sliding_window` keys on every layer (none when
it is null), and a head size of its own (`head_dim`)."""

from tpuplex.models import llama
from tpuplex.models.decoder import DecoderArch, DecoderFamily
from tpuplex.models.family import ConfigReader


def read(config: ConfigReader) -> DecoderArch:
    windows = llama.sliding_windows(config, config.layers("num_hidden_layers"), everywhere=True)
    return llama.read_llama_like(config, "mistral", windows=windows)


MISTRAL = DecoderFamily(model_types=("mistral",), hf_class="MistralForCausalLM", modules=llama.MODULES, read=read,
                        peft_targets=("q_proj", "v_proj"))

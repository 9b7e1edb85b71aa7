"""Phi-3 (`Phi3ForCausalLM`): Llama's shape with the query, key and value in one projection (`qkv_proj`, [q | k | v])
and the gate and up projections in one (`gate_up_proj`, [gate | up]), dropout on the embeddings and the residual
branches, and a sliding window on every layer when `sliding_window` is set.

PEFT has no default targets for Phi-3; tpuplex adapts `qkv_proj`, as GPT-2's default adapts its fused `c_attn`."""

from tpuplex.errors import TpuplexError
from tpuplex.models import llama
from tpuplex.models.decoder import DecoderArch, DecoderFamily
from tpuplex.models.family import ConfigReader


def read(config: ConfigReader) -> DecoderArch:
    parameters = config.get("rope_parameters", dict, None) or {}
    factor = parameters.get("partial_rotary_factor", config.get("partial_rotary_factor", float, 1.0))
    if factor != 1.0:
        raise TpuplexError(f"partial_rotary_factor = {factor} in {config.path} is not supported: tpuplex builds "
                           "Phi-3 with rotary positions on the whole head")
    windows = llama.sliding_windows(config, config.layers("num_hidden_layers"), everywhere=True)
    return llama.read_llama_like(
        config, "phi3", fused_qkv=True, fused_gate_up=True, windows=windows,
        norm_eps=config.get("rms_norm_eps", float, 1e-5), embedding_dropout=config.get("embd_pdrop", float, 0.0),
        residual_dropout=config.get("resid_pdrop", float, 0.0))


_LAYER = "model.layers.{block}"
PHI3 = DecoderFamily(
    model_types=("phi3",), hf_class="Phi3ForCausalLM",
    modules={**{k: v for k, v in llama.MODULES.items() if k not in ("block.query", "block.key", "block.value",
                                                                     "block.gate", "block.up")},
             "block.qkv": f"{_LAYER}.self_attn.qkv_proj", "block.gate_up": f"{_LAYER}.mlp.gate_up_proj"},
    read=read, peft_targets=("qkv_proj",))

"""Phi-3 (`Phi3ForCausalLM`): Llama's shape with the query, key and value in one projection (`qkv_proj`, [q | k | v])
and the gate and up projections in one (`gate_up_proj`, [gate | up]), no biases, dropout on the embeddings and the
residual branches, a sliding window on every layer when `sliding_window` is set, and rotary positions on the leading
`partial_rotary_factor` of each head (Phi-4-mini: 0.75), long-context factors (`longrope`) past
`original_max_position_embeddings`.

PEFT has no default targets for Phi-3; tpuplex adapts `qkv_proj`, as GPT-2's default adapts its fused `c_attn`."""

from tpuplex.models import llama
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.decoder import DecoderArch, DecoderFamily

DEFAULTS = {"num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False, "attention_dropout": 0.0, "initializer_range": 0.02, "resid_pdrop": 0.0,
            "embd_pdrop": 0.0, "sliding_window": None, "original_max_position_embeddings": 4096}
"""The config.json keys Phi-3 reads that may be absent, and `transformers.Phi3Config`'s default for each
(`original_max_position_embeddings` read by `tpuplex.models.rope.read`)."""


def read(config: ConfigReader) -> DecoderArch:
    window = llama.sliding_window(config, DEFAULTS["sliding_window"])
    return llama.read_llama_like(
        config, "phi3", DEFAULTS, phi3=True, fused_qkv=True, fused_gate_up=True,
        windows=llama.sliding_windows(config, config.layers("num_hidden_layers"), window, None),
        embedding_dropout=config.get("embd_pdrop", float, DEFAULTS["embd_pdrop"]),
        residual_dropout=config.get("resid_pdrop", float, DEFAULTS["resid_pdrop"]))


_LAYER = "model.layers.{block}"
PHI3 = DecoderFamily(
    model_types=("phi3",), hf_class="Phi3ForCausalLM",
    modules={**{k: v for k, v in llama.MODULES.items() if k not in ("block.query", "block.key", "block.value",
                                                                     "block.gate", "block.up")},
             "block.qkv": f"{_LAYER}.self_attn.qkv_proj", "block.gate_up": f"{_LAYER}.mlp.gate_up_proj"},
    read=read, peft_targets=("qkv_proj",))

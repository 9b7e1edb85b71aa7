"""Llama (`LlamaForCausalLM`): rotary positions, RMSNorm, SwiGLU, grouped-query attention, its own LM head unless
`tie_word_embeddings`; and the reading of config.json the Llama-shaped families share (`read_llama_like`), each
absent key read as the family's transformers config class defaults it (`DEFAULTS`), its rotary table as
`tpuplex.models.rope.read` reads it."""

from typing import Any

from tpuplex.errors import TpuplexError
from tpuplex.models import rope
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.decoder import DecoderArch, DecoderFamily


def sliding_window(config: ConfigReader, default: int | None) -> int:
    """config.json's `sliding_window` (0: none, as null gives), or the family's transformers default."""
    if "sliding_window" in config.config and config.config["sliding_window"] is None:
        return 0
    return config.positive("sliding_window", default) or 0


def sliding_windows(config: ConfigReader, layers: int, window: int, kinds: list | None) -> tuple[int, ...]:
    """Each layer's sliding window (0: none): `window` keys on the "sliding_attention" layers of `kinds`
    (transformers 5's `layer_types`), or on every layer where kinds is None (Mistral, Phi-3)."""
    if kinds is None:
        return (window,) * layers if window else ()
    if not isinstance(kinds, list) or len(kinds) != layers or not set(kinds) <= {"sliding_attention",
                                                                                  "full_attention"}:
        raise TpuplexError(f"layer_types in {config.path} must give each of the {layers} layers "
                           "'sliding_attention' or 'full_attention': fix the checkpoint's config.json")
    if "sliding_attention" in kinds and not window:
        raise TpuplexError(f"{config.path} has sliding_attention layers but no sliding_window (or, in Qwen2, "
                           "use_sliding_window false), which transformers cannot build: set them")
    windows = tuple(window if kind == "sliding_attention" else 0 for kind in kinds)
    return windows if any(windows) else ()


DEFAULTS = {"num_key_value_heads": None, "head_dim": None, "hidden_act": "silu", "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
            "attention_dropout": 0.0, "initializer_range": 0.02}
"""The config.json keys Llama reads that may be absent, and `transformers.LlamaConfig`'s default for each (a
None head count or size is derived: the query heads, hidden / heads)."""


def read_llama_like(config: ConfigReader, family: str, defaults: dict[str, Any], *, phi3: bool = False,
                    **switches) -> DecoderArch:
    """A Llama-shaped decoder (rotary positions, RMSNorm, a gated MLP, grouped-query attention, torch Linear
    layout) read from config.json under Llama's key names, each absent key taking the family's transformers default
    (`defaults`: the keys it reads; `attention_bias` and `mlp_bias` only where the family's transformers class reads
    them); `switches` are the family's own `DecoderArch` fields."""
    hidden, heads = config.positive("hidden_size"), config.positive("num_attention_heads")
    head_dim = config.positive("head_dim", defaults.get("head_dim")) or hidden // heads
    attention_bias = "attention_bias" in defaults and config.get("attention_bias", bool, defaults["attention_bias"])
    max_positions = config.positive("max_position_embeddings", defaults["max_position_embeddings"])
    fields = dict(
        family=family, vocab_size=config.positive("vocab_size", None) or 0, hidden_size=hidden,
        num_layers=config.layers("num_hidden_layers"), num_heads=heads,
        num_kv_heads=config.positive("num_key_value_heads", defaults["num_key_value_heads"]) or heads,
        head_dim=head_dim, intermediate_size=config.positive("intermediate_size"), max_positions=max_positions,
        rope=rope.read(config, head_dim, max_positions, phi3=phi3), rms_norm=True, norm_bias=False,
        norm_eps=config.get("rms_norm_eps", float, defaults["rms_norm_eps"]),
        activation=config.get("hidden_act", str, defaults.get("hidden_act")), fused_qkv=False, gated_mlp=True,
        qkv_bias=attention_bias, output_bias=attention_bias,
        mlp_bias="mlp_bias" in defaults and config.get("mlp_bias", bool, defaults["mlp_bias"]),
        kernel_layout="out_in", tied=config.get("tie_word_embeddings", bool, defaults["tie_word_embeddings"]),
        embedding_dropout=0.0, attention_dropout=config.get("attention_dropout", float, defaults["attention_dropout"]),
        residual_dropout=0.0, initializer_range=config.get("initializer_range", float, defaults["initializer_range"]),
        scaled_output_init=False,
    )
    return DecoderArch(**(fields | switches))


def read(config: ConfigReader) -> DecoderArch:
    return read_llama_like(config, "llama", DEFAULTS)


_LAYER = "model.layers.{block}"
MODULES = {"embeddings.word": "model.embed_tokens", "block.attention_norm": f"{_LAYER}.input_layernorm",
           "block.query": f"{_LAYER}.self_attn.q_proj", "block.key": f"{_LAYER}.self_attn.k_proj",
           "block.value": f"{_LAYER}.self_attn.v_proj", "block.attention_output": f"{_LAYER}.self_attn.o_proj",
           "block.mlp_norm": f"{_LAYER}.post_attention_layernorm", "block.gate": f"{_LAYER}.mlp.gate_proj",
           "block.up": f"{_LAYER}.mlp.up_proj", "block.down": f"{_LAYER}.mlp.down_proj",
           "final_norm": "model.norm", "lm_head": "lm_head"}
"""Llama's HF modules, which the Llama-shaped families (Qwen2, Mistral, Gemma 2, Phi-3) share but for a few."""

LLAMA = DecoderFamily(model_types=("llama",), hf_class="LlamaForCausalLM", modules=MODULES, read=read,
                      peft_targets=("q_proj", "v_proj"))

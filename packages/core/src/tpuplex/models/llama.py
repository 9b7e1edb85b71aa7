"""Llama (`LlamaForCausalLM`): rotary positions, RMSNorm, SwiGLU, grouped-query attention, its own LM head unless
`tie_word_embeddings`; and the reading of config.json the Llama-shaped families share (`read_llama_like`)."""

from tpuplex.errors import TpuplexError
from tpuplex.models.decoder import DecoderArch, DecoderFamily
from tpuplex.models.family import ConfigReader


def rope_theta(config: ConfigReader) -> float:
    """The rotary base: `rope_parameters.rope_theta` (transformers 5) or `rope_theta`; only the default rotary
    kind (no scaling) is built."""
    parameters = config.get("rope_parameters", dict, None) or config.get("rope_scaling", dict, None) or {}
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if kind != "default":
        raise TpuplexError(f"rope_type {kind!r} in {config.path} is not supported: tpuplex builds Llama with the "
                           "default rotary positions (no scaling)")
    theta = parameters.get("rope_theta", config.get("rope_theta", float, 10000.0))
    if not isinstance(theta, int | float) or theta <= 0:
        raise TpuplexError(f"rope_theta = {theta!r} in {config.path} must be a positive number: fix the "
                           "checkpoint's config.json")
    return float(theta)


def sliding_windows(config: ConfigReader, layers: int, everywhere: bool) -> tuple[int, ...]:
    """Each layer's sliding window (0: none) from transformers 5's `layer_types` ("sliding_attention" layers see
    `sliding_window` keys), or, in a config.json without them, `sliding_window` on every layer where the family
    slides `everywhere` (Mistral, Phi-3) when it is set."""
    window = config.positive("sliding_window", None) or 0
    kinds = config.get("layer_types", list, None)
    if kinds is None:
        return (window,) * layers if everywhere and window else ()
    if len(kinds) != layers or not set(kinds) <= {"sliding_attention", "full_attention"}:
        raise TpuplexError(f"layer_types in {config.path} must give each of the {layers} layers "
                           "'sliding_attention' or 'full_attention': fix the checkpoint's config.json")
    if "sliding_attention" in kinds and not window:
        raise TpuplexError(f"{config.path} has sliding_attention layers but no sliding_window: set it")
    windows = tuple(window if kind == "sliding_attention" else 0 for kind in kinds)
    return windows if any(windows) else ()


def read_llama_like(config: ConfigReader, family: str, **switches) -> DecoderArch:
    """A Llama-shaped decoder (rotary positions, RMSNorm, a gated MLP, grouped-query attention, torch Linear
    layout) read from config.json under Llama's key names; `switches` are the family's own `DecoderArch` fields."""
    if config.get("pretraining_tp", int, 1) != 1:
        raise TpuplexError(f"pretraining_tp in {config.path} must be 1: tpuplex computes the projections whole")
    hidden, heads = config.positive("hidden_size"), config.positive("num_attention_heads")
    attention_bias = config.get("attention_bias", bool, False)
    layers = config.layers("num_hidden_layers")
    fields = dict(
        family=family, vocab_size=config.positive("vocab_size", None) or 0, hidden_size=hidden,
        num_layers=layers, num_heads=heads, num_kv_heads=config.positive("num_key_value_heads", None) or heads,
        head_dim=config.positive("head_dim", None) or hidden // heads,
        intermediate_size=config.positive("intermediate_size"),
        max_positions=config.positive("max_position_embeddings"), rope_theta=rope_theta(config), rms_norm=True,
        norm_bias=False, norm_eps=config.get("rms_norm_eps", float, 1e-6),
        activation=config.get("hidden_act", str, "silu"), fused_qkv=False, gated_mlp=True,
        qkv_bias=attention_bias, output_bias=attention_bias, mlp_bias=config.get("mlp_bias", bool, False),
        kernel_layout="out_in", tied=config.get("tie_word_embeddings", bool, False), embedding_dropout=0.0,
        attention_dropout=config.get("attention_dropout", float, 0.0), residual_dropout=0.0,
        initializer_range=config.get("initializer_range", float, 0.02), scaled_output_init=False,
    )
    return DecoderArch(**(fields | switches))


def read(config: ConfigReader) -> DecoderArch:
    return read_llama_like(config, "llama")


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

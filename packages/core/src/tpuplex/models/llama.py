"""Llama (`LlamaForCausalLM`): rotary positions, RMSNorm, SwiGLU, grouped-query attention, its own LM head unless
`tie_word_embeddings`."""

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


def read(config: ConfigReader) -> DecoderArch:
    if config.get("pretraining_tp", int, 1) != 1:
        raise TpuplexError(f"pretraining_tp in {config.path} must be 1: tpuplex computes the projections whole")
    hidden, heads = config.positive("hidden_size"), config.positive("num_attention_heads")
    head_dim = config.positive("head_dim", None) or hidden // heads
    return DecoderArch(
        family="llama", vocab_size=config.positive("vocab_size", None) or 0, hidden_size=hidden,
        num_layers=config.layers("num_hidden_layers"), num_heads=heads,
        num_kv_heads=config.positive("num_key_value_heads", None) or heads, head_dim=head_dim,
        intermediate_size=config.positive("intermediate_size"),
        max_positions=config.positive("max_position_embeddings"), rope_theta=rope_theta(config), rms_norm=True,
        norm_bias=False,
        norm_eps=config.get("rms_norm_eps", float, 1e-6), activation=config.get("hidden_act", str, "silu"),
        fused_qkv=False, gated_mlp=True, attention_bias=config.get("attention_bias", bool, False),
        mlp_bias=config.get("mlp_bias", bool, False), kernel_layout="out_in",
        tied=config.get("tie_word_embeddings", bool, False), embedding_dropout=0.0,
        attention_dropout=config.get("attention_dropout", float, 0.0), residual_dropout=0.0,
        initializer_range=config.get("initializer_range", float, 0.02), scaled_output_init=False,
    )


_LAYER = "model.layers.{block}"
LLAMA = DecoderFamily(
    model_types=("llama",),
    hf_class="LlamaForCausalLM",
    modules={"embeddings.word": "model.embed_tokens", "block.attention_norm": f"{_LAYER}.input_layernorm",
             "block.query": f"{_LAYER}.self_attn.q_proj", "block.key": f"{_LAYER}.self_attn.k_proj",
             "block.value": f"{_LAYER}.self_attn.v_proj", "block.attention_output": f"{_LAYER}.self_attn.o_proj",
             "block.mlp_norm": f"{_LAYER}.post_attention_layernorm", "block.gate": f"{_LAYER}.mlp.gate_proj",
             "block.up": f"{_LAYER}.mlp.up_proj", "block.down": f"{_LAYER}.mlp.down_proj",
             "final_norm": "model.norm", "lm_head": "lm_head"},
    read=read,
)

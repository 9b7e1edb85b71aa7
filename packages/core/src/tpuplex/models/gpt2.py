"""GPT-2 (`GPT2LMHeadModel`): learned positions, pre-LayerNorm blocks, fused q/k/v in Conv1D layout, GELU (tanh
form by default), the LM head tied to the word embeddings.

config.json may also say `"bias": false` (nanoGPT's switch, which HF's GPT-2 lacks): no Linear or LayerNorm has a
bias. The HF export writes those biases as zeros (`DecoderFamily.hf_weights`), which is the same model.
"""

from tpuplex.errors import TpuplexError
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.decoder import DecoderArch, DecoderFamily

DEFAULTS = {"n_positions": 1024, "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.1,
            "embd_pdrop": 0.1, "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "tie_word_embeddings": True}
"""The config.json keys GPT-2 reads that may be absent, and `transformers.GPT2Config`'s default for each."""


def read(config: ConfigReader) -> DecoderArch:
    for key in ("scale_attn_weights", "scale_attn_by_inverse_layer_idx"):
        supported = DEFAULTS[key]
        if config.get(key, bool, supported) != supported:
            raise TpuplexError(f"{key} = {not supported} in {config.path} is not supported: tpuplex builds GPT-2 "
                               f"with {key} = {supported}")
    hidden, heads = config.positive("n_embd"), config.positive("n_head")
    if hidden % heads:
        raise TpuplexError(f"{config.path}: n_embd {hidden} is not divisible by n_head {heads}: fix the "
                           "checkpoint's config.json")
    bias = config.get("bias", bool, True)
    return DecoderArch(
        family="gpt2", vocab_size=config.positive("vocab_size", None) or 0, hidden_size=hidden,
        num_layers=config.layers("n_layer"), num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
        intermediate_size=config.positive("n_inner", None) or 4 * hidden,
        max_positions=config.positive("n_positions", DEFAULTS["n_positions"]), rope=None, rms_norm=False,
        norm_bias=bias, norm_eps=config.get("layer_norm_epsilon", float, DEFAULTS["layer_norm_epsilon"]),
        activation=config.get("activation_function", str, DEFAULTS["activation_function"]), fused_qkv=True,
        gated_mlp=False, qkv_bias=bias, output_bias=bias, mlp_bias=bias, kernel_layout="in_out",
        tied=config.get("tie_word_embeddings", bool, DEFAULTS["tie_word_embeddings"]),
        **{field: config.get(key, float, DEFAULTS[key]) for field, key in (
            ("embedding_dropout", "embd_pdrop"), ("attention_dropout", "attn_pdrop"),
            ("residual_dropout", "resid_pdrop"), ("initializer_range", "initializer_range"))},
        scaled_output_init=True,
    )


_LAYER = "transformer.h.{block}"
GPT2 = DecoderFamily(
    model_types=("gpt2",),
    hf_class="GPT2LMHeadModel",
    modules={"embeddings.word": "transformer.wte", "embeddings.position": "transformer.wpe",
             "block.attention_norm": f"{_LAYER}.ln_1", "block.qkv": f"{_LAYER}.attn.c_attn",
             "block.attention_output": f"{_LAYER}.attn.c_proj", "block.mlp_norm": f"{_LAYER}.ln_2",
             "block.up": f"{_LAYER}.mlp.c_fc", "block.down": f"{_LAYER}.mlp.c_proj",
             "final_norm": "transformer.ln_f", "lm_head": "lm_head"},
    read=read,
    peft_targets=("c_attn",),
    hf_biased=True,
)

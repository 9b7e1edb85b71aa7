"""Small GGUF files written as llama.cpp's convert_hf_to_gguf.py writes them, from HF-named weights
(tests/core/test_gguf.py, and the torch session's check against transformers' own GGUF load)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 16, 4, 2, 24, 2
BYTES = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ"]
TOKENS = ["<unk>", "<|im_start|>", "<|im_end|>", *BYTES, "ab", "Ġa"]
MERGES = ["a b", "Ġ a"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py reordering of a query or key projection's rows."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2)
            .reshape(weight.shape))


def hf_weights(qwen2: bool = False) -> dict[str, np.ndarray]:
    """A Llama's weights (tied), or with `qwen2` a Qwen2's (q/k/v biases, an untied head)."""
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (len(TOKENS), HIDDEN), "model.norm.weight": (HIDDEN,)}
    if qwen2:
        shapes["lm_head.weight"] = (len(TOKENS), HIDDEN)
    for i in range(LAYERS):
        layer = f"model.layers.{i}"
        shapes |= {f"{layer}.input_layernorm.weight": (HIDDEN,), f"{layer}.post_attention_layernorm.weight": (HIDDEN,),
                   f"{layer}.self_attn.q_proj.weight": (HIDDEN, HIDDEN),
                   f"{layer}.self_attn.k_proj.weight": (HIDDEN // HEADS * KV_HEADS, HIDDEN),
                   f"{layer}.self_attn.v_proj.weight": (HIDDEN // HEADS * KV_HEADS, HIDDEN),
                   f"{layer}.self_attn.o_proj.weight": (HIDDEN, HIDDEN), f"{layer}.mlp.gate_proj.weight": (FFN, HIDDEN),
                   f"{layer}.mlp.up_proj.weight": (FFN, HIDDEN), f"{layer}.mlp.down_proj.weight": (HIDDEN, FFN)}
        if qwen2:
            shapes |= {f"{layer}.self_attn.{part}_proj.bias": (shapes[f"{layer}.self_attn.{part}_proj.weight"][0],)
                       for part in "qkv"}
    return {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}


GGUF_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(name: str) -> str:
    if not name.startswith("model.layers."):
        return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}[name]
    _, _, index, module = name.rsplit(".", 1)[0].split(".", 3)
    return f"blk.{index}.{GGUF_NAMES[module]}.{name.rsplit('.', 1)[1]}"


def write_gguf(path: Path, weights: dict[str, np.ndarray], architecture: str = "llama", pre: str = "smollm") -> Path:
    """The file llama.cpp writes for `architecture` ("llama": its query and key rows reordered; "qwen2": as HF's)."""
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_block_count(LAYERS)
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(TOKENS)
    writer.add_token_types([2, 3, 3] + [1] * (len(TOKENS) - 3))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TEMPLATE)
    for name, array in weights.items():
        heads = HEADS if "q_proj" in name else KV_HEADS
        interleaved = architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight"))
        writer.add_tensor(gguf_name(name), permute(array, heads) if interleaved else array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path



"""Small GGUF files written as llama.cpp's convert_hf_to_gguf.py writes them, from HF-named weights
(tests/core/test_gguf.py, and the torch session's check against transformers' own GGUF load)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 16, 4, 2, 24, 2
HEAD_DIM, KV_DIM = HIDDEN // HEADS, HIDDEN // HEADS * KV_HEADS
BYTES = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ"]
TOKENS = ["<unk>", "<|im_start|>", "<|im_end|>", *BYTES, "ab", "Ġa"]
MERGES = ["a b", "Ġ a"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"

PIECES = ["<unk>", "<s>", "</s>", "<|user|>", "<think>", *(f"<0x{byte:02X}>" for byte in range(256)),
          "▁", "a", "b", "c", "d", "▁a", "ab", "bc", "▁ab", "cd", "  "]
"""A SentencePiece ("llama") vocabulary: unknown, BOS, EOS, a control and a user-defined token, the byte fallbacks,
pieces, and a run of spaces spelled as Gemma's files spell it."""
PIECE_TYPES = [2, 3, 3, 3, 4, *[6] * 256, *[1] * 11]
PIECE_SCORES = [0.0] * 261 + [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -9.0, -7.0, -8.0, -10.0, -11.0]
"""The scores rank "bc" above "ab", against their order: SentencePiece files merge by score, Gemma's by order."""
SENTENCEPIECE_TEXT = "ab abc  bcd<|user|>a<think>d é"

SENTENCEPIECE_FAMILIES = {"gemma2", "phi3"}


def permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py reordering of a query or key projection's rows."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2)
            .reshape(weight.shape))


def hf_weights(family: str = "llama", sentencepiece: bool | None = None) -> dict[str, np.ndarray]:
    """A Llama's weights (tied), or a Qwen2's (q/k/v biases, an untied head), a Gemma 2's (four norms a layer,
    tied) or a Phi-3's (fused qkv and gate_up, an untied head), for the family's vocabulary (`sentencepiece`:
    PIECES rather than TOKENS)."""
    rng = np.random.default_rng(0)
    sentencepiece = family in SENTENCEPIECE_FAMILIES if sentencepiece is None else sentencepiece
    vocabulary = len(PIECES if sentencepiece else TOKENS)
    shapes = {"model.embed_tokens.weight": (vocabulary, HIDDEN), "model.norm.weight": (HIDDEN,)}
    if family in ("qwen2", "phi3"):
        shapes["lm_head.weight"] = (vocabulary, HIDDEN)
    for i in range(LAYERS):
        layer = f"model.layers.{i}"
        shapes |= {f"{layer}.input_layernorm.weight": (HIDDEN,), f"{layer}.post_attention_layernorm.weight": (HIDDEN,),
                   f"{layer}.self_attn.o_proj.weight": (HIDDEN, HIDDEN), f"{layer}.mlp.down_proj.weight": (HIDDEN, FFN)}
        if family == "phi3":
            shapes |= {f"{layer}.self_attn.qkv_proj.weight": (HIDDEN + 2 * KV_DIM, HIDDEN),
                       f"{layer}.mlp.gate_up_proj.weight": (2 * FFN, HIDDEN)}
            continue
        shapes |= {f"{layer}.self_attn.q_proj.weight": (HIDDEN, HIDDEN),
                   f"{layer}.self_attn.k_proj.weight": (KV_DIM, HIDDEN),
                   f"{layer}.self_attn.v_proj.weight": (KV_DIM, HIDDEN),
                   f"{layer}.mlp.gate_proj.weight": (FFN, HIDDEN), f"{layer}.mlp.up_proj.weight": (FFN, HIDDEN)}
        if family == "qwen2":
            shapes |= {f"{layer}.self_attn.{part}_proj.bias": (shapes[f"{layer}.self_attn.{part}_proj.weight"][0],)
                       for part in "qkv"}
        if family == "gemma2":
            shapes |= {f"{layer}.pre_feedforward_layernorm.weight": (HIDDEN,),
                       f"{layer}.post_feedforward_layernorm.weight": (HIDDEN,)}
    return {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}


GGUF_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
              "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}
GEMMA2_NAMES = GGUF_NAMES | {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                             "post_feedforward_layernorm": "post_ffw_norm"}


def gguf_name(name: str, architecture: str = "llama") -> str:
    if not name.startswith("model.layers."):
        return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}[name]
    _, _, index, module = name.rsplit(".", 1)[0].split(".", 3)
    names = GEMMA2_NAMES if architecture == "gemma2" else GGUF_NAMES
    return f"blk.{index}.{names[module]}.{name.rsplit('.', 1)[1]}"


def write_gguf(path: Path, weights: dict[str, np.ndarray], architecture: str = "llama", pre: str = "smollm",
               sentencepiece: bool | None = None, extra: dict[str, np.ndarray] | None = None,
               merges: list[str] = MERGES) -> Path:
    """The file llama.cpp writes for `architecture` ("llama": its query and key rows reordered; "gemma2": every norm
    stored as 1 + weight; "qwen2", "phi3": as HF's), with a SentencePiece vocabulary (PIECES, as Gemma's, Phi-3's,
    Mistral's and Llama 2's files) or a byte-level BPE (TOKENS, `pre` its pre-tokenizer) as `sentencepiece` says
    (by default: as the family's files have); `extra`: tensors added under their GGUF names; `merges`: the
    byte-level vocabulary's (none: the key left out)."""
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_block_count(LAYERS)
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    if architecture == "gemma2":
        writer.add_key_length(HEAD_DIM)
        writer.add_value_length(HEAD_DIM)
        writer.add_sliding_window(8)
        writer.add_attn_logit_softcapping(50.0)
        writer.add_final_logit_softcapping(30.0)
    if architecture in SENTENCEPIECE_FAMILIES if sentencepiece is None else sentencepiece:
        writer.add_tokenizer_model("llama")
        writer.add_token_list(PIECES)
        writer.add_token_types(PIECE_TYPES)
        writer.add_token_scores(PIECE_SCORES)
        writer.add_unk_token_id(0)
        writer.add_pad_token_id(2)  # transformers' Phi3Config would otherwise pad with id 32000
    else:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(TOKENS)
        writer.add_token_types([2, 3, 3] + [1] * (len(TOKENS) - 3))
        if merges:
            writer.add_token_merges(merges)
        writer.add_chat_template(TEMPLATE)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, array in weights.items():
        heads = HEADS if "q_proj" in name else KV_HEADS
        if architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            array = permute(array, heads)
        if architecture == "gemma2" and name.endswith("norm.weight"):
            array = array + np.float32(1)
        writer.add_tensor(gguf_name(name, architecture), array)
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

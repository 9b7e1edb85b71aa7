"""A GGUF file of the Llama family becomes an HF checkpoint folder (`tpuplex.models.gguf`): the config from its
metadata, the weights under HF's names with llama.cpp's query/key row order undone, a byte-level BPE tokenizer
with its control tokens whole and the chat template; files that are not a Llama GGUF are refused in one line. The
real SmolLM2 file against transformers' own GGUF load is tests/common/decoder_checks.py's."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from tpuplex.errors import TpuplexError
from tpuplex.models import gguf as tpuplex_gguf
from tpuplex.params import resolve_checkpoint

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS = 16, 4, 2, 24, 2
BYTES = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ"]
TOKENS = ["<unk>", "<|im_start|>", "<|im_end|>", *BYTES, "ab", "Ġa"]
MERGES = ["a b", "Ġ a"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py reordering of a query or key projection's rows."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2)
            .reshape(weight.shape))


def hf_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (len(TOKENS), HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        layer = f"model.layers.{i}"
        shapes |= {f"{layer}.input_layernorm.weight": (HIDDEN,), f"{layer}.post_attention_layernorm.weight": (HIDDEN,),
                   f"{layer}.self_attn.q_proj.weight": (HIDDEN, HIDDEN),
                   f"{layer}.self_attn.k_proj.weight": (HIDDEN // HEADS * KV_HEADS, HIDDEN),
                   f"{layer}.self_attn.v_proj.weight": (HIDDEN // HEADS * KV_HEADS, HIDDEN),
                   f"{layer}.self_attn.o_proj.weight": (HIDDEN, HIDDEN), f"{layer}.mlp.gate_proj.weight": (FFN, HIDDEN),
                   f"{layer}.mlp.up_proj.weight": (FFN, HIDDEN), f"{layer}.mlp.down_proj.weight": (HIDDEN, FFN)}
    return {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}


GGUF_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(name: str) -> str:
    if not name.startswith("model.layers."):
        return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}[name]
    _, _, index, module = name.removesuffix(".weight").split(".", 3)
    return f"blk.{index}.{GGUF_NAMES[module]}.weight"


def write_gguf(path: Path, weights: dict[str, np.ndarray], architecture: str = "llama") -> Path:
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
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types([2, 3, 3] + [1] * (len(TOKENS) - 3))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TEMPLATE)
    for name, array in weights.items():
        heads = HEADS if "q_proj" in name else KV_HEADS
        writer.add_tensor(gguf_name(name), permute(array, heads) if "q_proj" in name or "k_proj" in name else array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_llama_gguf_becomes_an_hf_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(tpuplex_gguf.CACHE_ENV, str(tmp_path / "cache"))
    weights = hf_weights()
    folder = resolve_checkpoint(str(write_gguf(tmp_path / "tiny.gguf", weights)))
    assert resolve_checkpoint(str(tmp_path / "tiny.gguf")) == folder  # converted once, then cached
    config = json.loads((folder / "config.json").read_text())
    assert {key: config[key] for key in ("num_attention_heads", "num_key_value_heads", "num_hidden_layers",
                                         "intermediate_size", "vocab_size", "tie_word_embeddings", "rope_theta")} == {
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "num_hidden_layers": LAYERS,
        "intermediate_size": FFN, "vocab_size": len(TOKENS), "tie_word_embeddings": True, "rope_theta": 100000.0}
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    converted = load_file(folder / "model.safetensors")
    assert converted.keys() == weights.keys()
    for name, array in weights.items():
        np.testing.assert_array_equal(converted[name], array, err_msg=name)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tokenizer.encode("<|im_start|>ab a<|im_end|>").tokens == ["<|im_start|>", "ab", "Ġa", "<|im_end|>"]
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    assert settings["chat_template"] == TEMPLATE and settings["eos_token"] == "<|im_end|>"


def test_what_is_not_a_llama_gguf_is_refused_in_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(tpuplex_gguf.CACHE_ENV, str(tmp_path / "cache"))
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(TpuplexError, match=r"garbage.gguf is not a readable GGUF file"):
        resolve_checkpoint(str(garbage))
    other = write_gguf(tmp_path / "other.gguf", hf_weights(), architecture="gpt2")
    with pytest.raises(TpuplexError, match=r"holds a 'gpt2' model: tpuplex reads GGUF files of the Llama family"):
        resolve_checkpoint(str(other))
    assert not any((tmp_path / "cache" / "gguf").iterdir())  # nothing half-written

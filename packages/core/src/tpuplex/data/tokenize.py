"""Tokenization into static-shape arrays, with an on-disk cache so each split is tokenized once.

The tokenizer is the checkpoint's HF fast tokenizer: `tokenizer.json`, or, when only `vocab.txt` exists, a BERT
WordPiece tokenizer that lowercases as `tokenizer_config.json` says (`do_lower_case`, default true). Truncation is
set here (longest_first to max_length, special tokens included) and the file's own padding is switched off, so
the checkpoint's saved settings never change the arrays.

The cache entry is keyed by a hash of everything the arrays depend on: the tokenizer files, the task, the split,
max_length and the source's fingerprint (the data's content; for your own data also its column and label
settings). It is a prepared folder (`tpuplex.data.prepared_tokens`), published whole or not at all, and a run reads
its rows lazily from it: what is tokenized once is never held whole in memory again.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
import shutil
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

from tpuplex.data.batching import Encoded
from tpuplex.data.prepared_tokens import PreparedTokens, open_tokens, write_tokens
from tpuplex.data.shards import MANIFEST
from tpuplex.errors import TpuplexError
from tpuplex.glue.datasets import Dataset
from tpuplex.glue.files import Examples
from tpuplex.glue.sources import Source, resolve_source

PAD_ID = 0
# Bump when the arrays written for the same inputs change, so old cache files are not reused.
CACHE_FORMAT = 2


def _tokenizer_files(tokenizer_dir: Path) -> tuple[Path, bool | None]:
    """(tokenizer.json, None), or (vocab.txt, lowercase) when only a WordPiece vocabulary exists."""
    tokenizer_dir = Path(tokenizer_dir)
    if (tokenizer_dir / "tokenizer.json").is_file():
        return tokenizer_dir / "tokenizer.json", None
    if (tokenizer_dir / "vocab.txt").is_file():
        return tokenizer_dir / "vocab.txt", _lowercase(tokenizer_dir / "tokenizer_config.json")
    slow = [name for name in ("vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model")
            if (tokenizer_dir / name).is_file()]
    if slow:
        raise TpuplexError(f"{tokenizer_dir} has only a slow tokenizer ({', '.join(slow)}): write its tokenizer.json "
                           "once with transformers: AutoTokenizer.from_pretrained(folder).save_pretrained(folder)")
    raise TpuplexError(f"no tokenizer in {tokenizer_dir}: the checkpoint folder needs tokenizer.json or vocab.txt "
                       "(save the tokenizer with the model, e.g. tokenizer.save_pretrained(folder))")


def _lowercase(config_path: Path) -> bool:
    if not config_path.is_file():
        return True  # BERT's default, and BertWordPieceTokenizer's
    try:
        value = json.loads(config_path.read_text(encoding="utf-8")).get("do_lower_case", True)
    except (json.JSONDecodeError, AttributeError):
        raise TpuplexError(f"{config_path} is not a JSON object: repair it or delete it to lowercase by default") \
            from None
    if not isinstance(value, bool):
        raise TpuplexError(f"{config_path}: do_lower_case = {value!r} must be true or false")
    return value


def tokenizer_hash(tokenizer_dir: Path) -> str:
    """A hash of the tokenizer's files: a prepared corpus is read only with the tokenizer it was made with."""
    digest = hashlib.sha256()
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        if (Path(tokenizer_dir) / name).is_file():
            digest.update(name.encode() + (Path(tokenizer_dir) / name).read_bytes())
    return digest.hexdigest()


def load_tokenizer(tokenizer_dir: Path, max_length: int) -> Tokenizer:
    """The checkpoint's tokenizer, truncating (longest_first) to `max_length` tokens and not padding."""
    if max_length < 1:
        raise TpuplexError(f"data.max_length = {max_length} must be positive: use e.g. 128")
    path, lowercase = _tokenizer_files(tokenizer_dir)
    try:
        if lowercase is None:
            tokenizer = Tokenizer.from_file(str(path))
        else:
            # Serialised and reloaded to get a plain Tokenizer rather than the implementation wrapper.
            tokenizer = Tokenizer.from_str(BertWordPieceTokenizer(str(path), lowercase=lowercase).to_str())
    except Exception as error:  # noqa: BLE001 - the tokenizers library raises plain Exceptions for unreadable files
        raise TpuplexError(f"cannot load the tokenizer {path} ({error}): give a checkpoint folder with a valid "
                           "tokenizer.json or vocab.txt") from None
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length, strategy="longest_first")
    return tokenizer


def encode(examples: Examples, tokenizer: Tokenizer, max_length: int) -> Encoded:
    """Tokenize every example ([CLS] a [SEP] (b [SEP])) into arrays right-padded with id 0 to [N, max_length].

    `tokenizer` must truncate to at most `max_length` tokens (as `load_tokenizer` sets it up).
    """
    if examples.text_b is None:
        inputs = examples.text_a
    else:
        inputs = list(zip(examples.text_a, examples.text_b, strict=True))
    try:
        encodings = tokenizer.encode_batch(inputs)
    except Exception as error:  # noqa: BLE001 - e.g. max_length shorter than the special tokens
        raise TpuplexError(f"tokenization failed ({error}): check data.max_length = {max_length} "
                           "(it must leave room for [CLS] and [SEP] tokens)") from None
    ids = [encoding.ids for encoding in encodings]
    lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
    if lengths.size and lengths.max() > max_length:
        raise TpuplexError(f"the tokenizer returned {lengths.max()} tokens for max_length = {max_length}: "
                           "load it with load_tokenizer(folder, max_length)")
    flat_ids = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
    flat_type_ids = np.fromiter(itertools.chain.from_iterable(encoding.type_ids for encoding in encodings),
                                dtype=np.int32, count=int(lengths.sum()))
    return _pad(flat_ids, flat_type_ids, lengths, examples.labels, max_length)


def _pad(ids: np.ndarray, type_ids: np.ndarray, lengths: np.ndarray, labels: np.ndarray,
         max_length: int) -> Encoded:
    """Encoded arrays from the concatenated rows: ids, type_ids [sum(lengths)] and lengths [N]."""
    real = np.arange(max_length)[None, :] < lengths[:, None]  # [N, max_length], row-major = concatenation order
    input_ids = np.full((len(lengths), max_length), PAD_ID, dtype=np.int32)
    token_type_ids = np.zeros((len(lengths), max_length), dtype=np.int32)
    input_ids[real] = ids
    token_type_ids[real] = type_ids
    return Encoded(input_ids, token_type_ids, lengths, labels)


def cache_path(cache_dir: Path, task: Dataset, split: str, max_length: int, tokenizer_dir: Path,
               source: Source) -> Path:
    """The cache entry for these inputs: the prepared folder `<task>-<split>-L<max_length>-<hash>` in `cache_dir`."""
    tokenizer_file, lowercase = _tokenizer_files(tokenizer_dir)
    key = hashlib.sha256()
    for part in (CACHE_FORMAT, tokenizers.__version__, tokenizer_file.name, lowercase, task.name, split,
                 max_length, source.fingerprint):
        key.update(repr(part).encode() + b"\0")
    key.update(tokenizer_file.read_bytes())
    return Path(cache_dir) / f"{task.name}-{split}-L{max_length}-{key.hexdigest()[:20]}"


def read_cache(path: Path) -> PreparedTokens | None:
    """The cached split, read lazily from its shards, or None when absent or unreadable (it is then rebuilt)."""
    if not (path / MANIFEST).is_file():
        return None
    try:
        return open_tokens(path)
    except TpuplexError:
        shutil.rmtree(path, ignore_errors=True)
        return None


def write_cache(path: Path, encoded: Encoded) -> PreparedTokens:
    """Write `encoded` as the prepared folder `path` (published whole, or not at all) and open it. When another
    process published the same entry meanwhile, that one is used."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(path.parent, os.W_OK):
            raise PermissionError(errno.EACCES, "Permission denied")
    except OSError as error:
        raise TpuplexError(f"cannot write the token cache in {path.parent} ({error.strerror}): "
                           "set data.cache_dir to a writable folder") from None
    try:
        return write_tokens(path, [encoded])
    except (TpuplexError, OSError):
        published = read_cache(path)
        if published is None:
            raise
        return published


def cached_split(encoded: Encoded, cache_dir: Path, name: str) -> PreparedTokens:
    """`encoded` as a prepared folder of the cache, keyed by its content (`<name>-<fingerprint>`): for splits whose
    tokenizing is cheap beside the rest of their preparation (words aligned to tags)."""
    path = Path(cache_dir) / f"{name}-{encoded.fingerprint()}"
    cached = read_cache(path)
    return cached if cached is not None else write_cache(path, encoded)


def load_encoded(task: Dataset, split: str, data_dir: str | Path | None, tokenizer_dir: Path, max_length: int,
                 cache_dir: Path) -> PreparedTokens:
    """The tokenized split, from the cache when these exact inputs were tokenized before (read lazily).

    Data come from `data_dir` when given (the task folder, or a GLUE folder holding it), else from
    `$GLUE_DIR/<task.folder>`, else from the HF hub (see `tpuplex.glue.sources.resolve_source`).
    input_ids, token_type_ids: int32 [N, max_length]; lengths: int32 [N]; labels: int32 or float32 [N].
    """
    return encode_cached(task, split, resolve_source(task, split, data_dir), tokenizer_dir, max_length, cache_dir)


def encode_cached(task: Dataset, split: str, source: Source, tokenizer_dir: Path, max_length: int,
                  cache_dir: Path) -> PreparedTokens:
    """The tokenized `source`, from the cache when its fingerprint was tokenized before with these settings; read,
    tokenized and cached otherwise. Arrays as `load_encoded`'s."""
    path = cache_path(Path(cache_dir), task, split, max_length, Path(tokenizer_dir), source)
    cached = read_cache(path)
    if cached is not None:
        return cached
    encoded = encode(source.read(), load_tokenizer(Path(tokenizer_dir), max_length), max_length)
    return write_cache(path, encoded)

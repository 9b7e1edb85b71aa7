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
import json
import os
import shutil
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

from tpuplex.data.batching import Encoded
from tpuplex.data.prepared_tokens import PreparedTokens, open_tokens, write_tokens
from tpuplex.data.shards import MANIFEST
from tpuplex.errors import DataError, TpuplexError

PAD_ID = 0
# Bump when the arrays written for the same inputs change, so old cache files are not reused.
CACHE_FORMAT = 2


def tokenizer_files(tokenizer_dir: Path) -> tuple[Path, bool | None]:
    """(tokenizer.json, None), or (vocab.txt, lowercase) when only a WordPiece vocabulary exists."""
    tokenizer_dir = Path(tokenizer_dir)
    if (tokenizer_dir / "tokenizer.json").is_file():
        return tokenizer_dir / "tokenizer.json", None
    if (tokenizer_dir / "vocab.txt").is_file():
        return tokenizer_dir / "vocab.txt", _lowercase(tokenizer_dir / "tokenizer_config.json")
    slow = [name for name in ("vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model")
            if (tokenizer_dir / name).is_file()]
    if slow:
        raise DataError(f"{tokenizer_dir} has only a slow tokenizer ({', '.join(slow)}): write its tokenizer.json "
                        "once with transformers: AutoTokenizer.from_pretrained(folder).save_pretrained(folder)")
    raise DataError(f"no tokenizer in {tokenizer_dir}: the checkpoint folder needs tokenizer.json or vocab.txt "
                    "(save the tokenizer with the model, e.g. tokenizer.save_pretrained(folder))")


def _lowercase(config_path: Path) -> bool:
    if not config_path.is_file():
        return True  # BERT's default, and BertWordPieceTokenizer's
    try:
        value = json.loads(config_path.read_text(encoding="utf-8")).get("do_lower_case", True)
    except (json.JSONDecodeError, AttributeError):
        raise DataError(f"{config_path} is not a JSON object: repair it or delete it to lowercase by default") \
            from None
    if not isinstance(value, bool):
        raise DataError(f"{config_path}: do_lower_case = {value!r} must be true or false")
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
        raise DataError(f"data.max_length = {max_length} must be positive: use e.g. 128")
    path, lowercase = tokenizer_files(tokenizer_dir)
    try:
        if lowercase is None:
            tokenizer = Tokenizer.from_file(str(path))
        else:
            # Serialised and reloaded to get a plain Tokenizer rather than the implementation wrapper.
            tokenizer = Tokenizer.from_str(BertWordPieceTokenizer(str(path), lowercase=lowercase).to_str())
    except Exception as error:  # noqa: BLE001 - the tokenizers library raises plain Exceptions for unreadable files
        raise DataError(f"cannot load the tokenizer {path} ({error}): give a checkpoint folder with a valid "
                        "tokenizer.json or vocab.txt") from None
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length, strategy="longest_first")
    return tokenizer


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
        raise DataError(f"cannot write the token cache in {path.parent} ({error.strerror}): "
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

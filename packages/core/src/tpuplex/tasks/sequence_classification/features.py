"""Sequence classification's tokenized splits: examples (one text or a pair) encoded as [CLS] a [SEP] (b [SEP]) into
static-shape arrays, through the token cache (`tpuplex.data.tokenize`), keyed by the dataset, the split and the
source's fingerprint."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import Tokenizer

from tpuplex.data.batching import Encoded
from tpuplex.data.prepared_tokens import PreparedTokens
from tpuplex.data.tokenize import CACHE_FORMAT, PAD_ID, load_tokenizer, read_cache, tokenizer_files, write_cache
from tpuplex.errors import DataError
from tpuplex.tasks.sequence_classification.glue.datasets import Dataset
from tpuplex.tasks.sequence_classification.glue.files import Examples
from tpuplex.tasks.sequence_classification.glue.sources import Source, resolve_source


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
        raise DataError(f"tokenization failed ({error}): check data.max_length = {max_length} "
                        "(it must leave room for [CLS] and [SEP] tokens)") from None
    ids = [encoding.ids for encoding in encodings]
    lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
    if lengths.size and lengths.max() > max_length:
        raise DataError(f"the tokenizer returned {lengths.max()} tokens for max_length = {max_length}: "
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
    tokenizer_file, lowercase = tokenizer_files(tokenizer_dir)
    key = hashlib.sha256()
    for part in (CACHE_FORMAT, tokenizers.__version__, tokenizer_file.name, lowercase, task.name, split,
                 max_length, source.fingerprint):
        key.update(repr(part).encode() + b"\0")
    key.update(tokenizer_file.read_bytes())
    return Path(cache_dir) / f"{task.name}-{split}-L{max_length}-{key.hexdigest()[:20]}"


def load_encoded(task: Dataset, split: str, data_dir: str | Path | None, tokenizer_dir: Path, max_length: int,
                 cache_dir: Path) -> PreparedTokens:
    """The tokenized split, from the cache when these exact inputs were tokenized before (read lazily).

    Data come from `data_dir` when given (the task folder, or a GLUE folder holding it), else from
    `$GLUE_DIR/<task.folder>`, else from the HF hub (see `glue.sources.resolve_source`).
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

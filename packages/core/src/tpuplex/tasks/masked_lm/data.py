"""Raw text for masked-LM pre-training: read, tokenized once, packed into full rows, and masked per step.

Documents: every non-blank line of a `.txt` file, or every value of the text column (`[task] text_column`) of a
`.jsonl`, `.csv`, `.tsv` or `.parquet` file (`tpuplex.data.tables`). Each is tokenized with the checkpoint's
tokenizer with its special tokens ([CLS] text [SEP]) and no truncation; the documents' tokens are concatenated and
cut into rows of `data.max_length` (HF `run_mlm`'s `group_texts`), so every row but the last is full and there is
one static shape. The last, shorter row is kept (padded, as any short row is), not dropped.

Masking (`mask_tokens`) follows the original BERT's pre-training data: each row has round(n * p) of its n real,
non-special tokens chosen (HF's `DataCollatorForLanguageModeling` draws each token with probability p instead); a
chosen token becomes the mask token (80%), a random token (10%) or stays (10%). A batch lists the chosen positions
([B, P], P = round(max_length * p), BERT's `masked_lm_positions`), and the head runs on those positions only: the
same loss as over every position with the others weighted 0, for about half the work of a small encoder (the
decoder [E, V] is its largest matrix), with one static shape. The draw is numpy's, from the seed and the
optimizer step (training) or the example's index (evaluation), so every backend, replica count and resumed run
trains on the same masks.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
from tokenizers import Tokenizer

from tpuplex.data.batching import Encoded
from tpuplex.data.corpus import pack_stream
from tpuplex.data.prepared_tokens import PreparedTokens
from tpuplex.data.tables import DataFile, read_table
from tpuplex.data.tokenize import load_tokenizer, read_cache, tokenizer_hash, write_cache
from tpuplex.errors import DataError
from tpuplex.text_files import read_utf8

TASK = "masked_lm"
CACHE_FORMAT = 2
MASK_TOKENS = ("[MASK]", "<mask>")
"""The mask token's spelling in BERT-style (WordPiece, Unigram) and RoBERTa-style (BPE) vocabularies."""


def documents(file: DataFile, text_column: str) -> list[str]:
    """The non-blank documents of `file`: its lines (.txt) or its text column."""
    if file.path.suffix == ".txt":
        texts = read_utf8(file.path).splitlines()
    else:
        table = read_table(file, [text_column])
        texts = ["" if value is None else str(value) for value in table.columns[text_column]]
    found = [text.strip() for text in texts if text.strip()]
    if not found:
        raise DataError(f"{file.path} has no text ({file.field}): give a file with at least one non-blank line")
    return found


def pack(ids: list[list[int]], max_length: int) -> Encoded:
    """Documents' token ids, concatenated and cut into rows of `max_length` (the last row may be shorter)."""
    return pack_stream(np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=sum(map(len, ids))),
                       max_length)


def encode_packed(texts: list[str], tokenizer: Tokenizer, max_length: int, what: str) -> Encoded:
    """`texts` tokenized (special tokens included, no truncation) and packed into rows of `max_length`."""
    ids = [encoding.ids for encoding in tokenizer.encode_batch(texts)]
    total = sum(map(len, ids))
    if total < max_length:
        raise DataError(f"{what} gives {total} tokens, fewer than one row of data.max_length = {max_length}: "
                        "give more text or lower data.max_length")
    return pack(ids, max_length)


def packed_cached(texts: list[str], tokenizer: Tokenizer, tokenizer_dir: Path, max_length: int, cache_dir: Path,
                  what: str) -> PreparedTokens:
    """`encode_packed` with `tokenizer` (untruncated, loaded from `tokenizer_dir`) through the token cache, keyed
    by the text, the tokenizer files and max_length."""
    key = hashlib.sha256()
    for part in (CACHE_FORMAT, tokenizers.__version__, max_length, *texts):
        key.update(repr(part).encode() + b"\0")
    key.update(tokenizer_hash(tokenizer_dir).encode())
    path = Path(cache_dir) / f"masked_lm-L{max_length}-{key.hexdigest()[:20]}"
    cached = read_cache(path)
    if cached is not None:
        return cached
    return write_cache(path, encode_packed(texts, tokenizer, max_length, what))


def untruncated_tokenizer(tokenizer_dir: Path, max_length: int) -> Tokenizer:
    tokenizer = load_tokenizer(tokenizer_dir, max_length)
    tokenizer.no_truncation()
    return tokenizer


@dataclasses.dataclass(frozen=True)
class CorpusEncoder:
    """`tpuplex prepare`'s `tpuplex.data.corpus.DocumentEncoder` for masked LM: a document per non-blank line of a
    .txt file (stripped) or per .jsonl line's text, each tokenized with its special tokens ([CLS] text [SEP]) and
    no truncation, as `encode_packed` tokenizes documents in memory."""

    tokenizer_dir: str
    whole_files: bool = False

    @property
    def record(self) -> dict[str, Any]:
        return {"task": TASK, "tokenizer": tokenizer_hash(Path(self.tokenizer_dir))}

    def check(self) -> None:
        _untruncated(self.tokenizer_dir)

    def encode(self, documents: list[str], ends: list[bool]) -> np.ndarray:
        tokenizer = _untruncated(self.tokenizer_dir)
        ids = [encoding.ids for encoding in tokenizer.encode_batch(documents)] if documents else []
        return np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=sum(map(len, ids)))


@functools.lru_cache(maxsize=2)
def _untruncated(tokenizer_dir: str) -> Tokenizer:
    return untruncated_tokenizer(Path(tokenizer_dir), 1)


def special_ids(tokenizer: Tokenizer) -> np.ndarray:
    """int32 ids of the tokenizer's special tokens (never masked)."""
    return np.array(sorted(token_id for token_id, token in tokenizer.get_added_tokens_decoder().items()
                           if token.special), np.int32)


def mask_id(tokenizer: Tokenizer, tokenizer_dir: Path) -> int:
    """The id of the mask token; one clear error when the tokenizer has none."""
    for token in MASK_TOKENS:
        found = tokenizer.token_to_id(token)
        if found is not None:
            return found
    raise DataError(f"the tokenizer in {tokenizer_dir} has no mask token ({' or '.join(MASK_TOKENS)}): "
                    "masked-LM training needs a checkpoint whose tokenizer defines one")


def prediction_slots(length: int, probability: float) -> int:
    """The static number of masked positions a row of `length` tokens has room for: round(length * p), at least 1."""
    return max(1, int(np.floor(length * probability + 0.5)))


def mask_tokens(input_ids: np.ndarray, attention_mask: np.ndarray, row_weight: np.ndarray,
                rng: np.random.Generator, probability: float, mask: int, vocab_size: int,
                special: np.ndarray) -> dict[str, np.ndarray]:
    """Mask `input_ids` int32 [B, L] -> a dict of
        input_ids         int32 [B, L]  with the chosen tokens replaced (80% mask, 10% random, 10% kept),
        masked_positions  int32 [B, P]  each row's chosen positions, ascending, then 0 in unused slots,
        labels            int32 [B, P]  the original ids at those positions,
        weight          float32 [B, P]  `row_weight` [B] on used slots, 0 on unused ones,
    with P = prediction_slots(L, p). Each row has exactly round(n * p) (at least 1) of its n maskable tokens (real,
    not special) chosen, uniformly without replacement."""
    rows, length = input_ids.shape
    maskable = (attention_mask > 0) & ~np.isin(input_ids, special)
    available = maskable.sum(axis=1)
    counts = np.where(available > 0, np.maximum(1, np.floor(available * probability + 0.5)), 0)
    slots = prediction_slots(length, probability)
    # A random order of each row's maskable positions (the others after them): the first `count` are chosen.
    order = np.argsort(np.where(maskable, rng.random((rows, length)), 2.0), axis=1, kind="stable")[:, :slots]
    used = np.arange(slots)[None, :] < counts[:, None]
    positions = np.sort(np.where(used, order, length), axis=1)
    used = positions < length
    positions = np.where(used, positions, 0).astype(np.int32)
    labels = np.take_along_axis(np.asarray(input_ids, np.int32), positions, axis=1)
    draw = rng.random((rows, slots))
    random_ids = rng.integers(0, vocab_size, size=(rows, slots), dtype=np.int32)
    replacement = np.where(draw < 0.8, mask, np.where(draw < 0.9, random_ids, labels)).astype(np.int32)
    masked = np.array(input_ids, np.int32)
    row_index = np.broadcast_to(np.arange(rows)[:, None], positions.shape)
    masked[row_index[used], positions[used]] = replacement[used]
    weight = used.astype(np.float32) * np.asarray(row_weight, np.float32)[:, None]
    return {"input_ids": masked, "masked_positions": positions, "labels": labels, "weight": weight}

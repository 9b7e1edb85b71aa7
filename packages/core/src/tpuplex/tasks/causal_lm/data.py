"""Text for causal-LM training: read, tokenized into one stream of ids, and packed into overlapping rows.

Documents: a `.txt` file is one document, read as it is (newlines are text, as nanoGPT's char-level Shakespeare
reads input.txt); a `.jsonl`, `.csv`, `.tsv` or `.parquet` file gives one document per value of its text column.
When there are several, each is followed by the tokenizer's end-of-text token.

Tokenizers: the checkpoint's (`tokenizer.json`: GPT-2's byte-level BPE, Llama's, ...) without special tokens, or
a `Characters` vocabulary built as nanoGPT's `data/shakespeare_char/prepare.py` builds it: the sorted set of the
training text's characters (plus an end-of-text id when the data has several documents).

Packing: the stream is cut into rows of `max_length + 1` tokens that overlap by one (row i is tokens
[i L, i L + L + 1)), so a row's inputs are its first L tokens and its targets its last L, and every token of the
stream but the first is predicted exactly once. The last row is shorter (padded, its padding weighted 0).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from tpuplex.data.batching import Encoded
from tpuplex.data.tables import DataFile, read_table
from tpuplex.data.tokenize import load_tokenizer
from tpuplex.errors import TpuplexError
from tpuplex.text_files import read_utf8

END_OF_TEXT = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
"""The end-of-text token's spellings (GPT-2, Llama 2, Gemma, Llama 3), when tokenizer_config.json names none."""


def documents(file: DataFile, text_column: str) -> list[str]:
    """The file's documents: a .txt file whole, or the non-blank values of its text column."""
    if file.path.suffix == ".txt":
        texts = [read_utf8(file.path)]
    else:
        table = read_table(file, [text_column])
        texts = ["" if value is None else str(value) for value in table.columns[text_column]]
    found = [text for text in texts if text.strip()]
    if not found:
        raise TpuplexError(f"{file.path} has no text ({file.field}): give a file with some text in it")
    return found


@dataclasses.dataclass(frozen=True)
class Characters:
    """A character vocabulary: id i is `characters[i]`; `len(characters)` is the end-of-text id."""

    characters: str

    @classmethod
    def of(cls, texts: list[str]) -> Characters:
        """nanoGPT's vocabulary: the sorted set of the characters of `texts`."""
        return cls("".join(sorted(set().union(*texts))))

    @property
    def end_of_text(self) -> int:
        return len(self.characters)

    def encode(self, text: str, what: str) -> np.ndarray:
        """int32 ids of `text`; one clear error naming a character the vocabulary lacks."""
        codes = np.frombuffer(text.encode("utf-32-le"), np.uint32)
        table = np.frombuffer(self.characters.encode("utf-32-le"), np.uint32)
        ids = np.searchsorted(table, codes).astype(np.int32)
        unknown = (ids >= len(table)) | (table[np.minimum(ids, len(table) - 1)] != codes)
        if unknown.any():
            character = chr(int(codes[np.argmax(unknown)]))
            raise TpuplexError(f"{what} has the character {character!r}, which the run's character vocabulary (built "
                               "from data.train_file) lacks: train on text that has every character you feed")
        return ids

    def decode(self, ids: np.ndarray) -> str:
        return "".join(self.characters[i] if i < len(self.characters) else "\n" for i in np.asarray(ids))


class CheckpointTokenizer:
    """The checkpoint's tokenizer, adding no special tokens; `end_of_text` its end-of-text id (None if it has
    none)."""

    def __init__(self, folder: Path):
        self.tokenizer = load_tokenizer(folder, 1)
        self.tokenizer.no_truncation()
        config = folder / "tokenizer_config.json"
        named = json.loads(config.read_text(encoding="utf-8")).get("eos_token") if config.is_file() else None
        if isinstance(named, dict):
            named = named.get("content")
        found = (self.tokenizer.token_to_id(token) for token in [*([named] if isinstance(named, str) else []),
                                                                 *END_OF_TEXT])
        self.end_of_text = next((token for token in found if token is not None), None)

    def encode(self, text: str, what: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int32)

    def decode(self, ids: np.ndarray) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


Vocabulary = Characters | CheckpointTokenizer


def stream(texts: list[str], vocabulary: Vocabulary, what: str) -> np.ndarray:
    """int32 [T]: the documents' ids concatenated, each followed by end-of-text when there are several."""
    if len(texts) == 1:
        return vocabulary.encode(texts[0], what)
    end = vocabulary.end_of_text
    if end is None:
        raise TpuplexError(f"{what} has {len(texts)} documents, but the tokenizer has no end-of-text token to mark "
                           f"where one ends ({', '.join(END_OF_TEXT)}): give one .txt file, or a tokenizer with one")
    return np.concatenate([np.append(vocabulary.encode(text, what), np.int32(end)) for text in texts])


def pack(ids: np.ndarray, max_length: int, what: str) -> Encoded:
    """The stream `ids` [T] as rows of max_length + 1 tokens overlapping by one (see the module); the last row
    shorter, padded with 0."""
    total = len(ids)
    if total <= max_length:
        raise TpuplexError(f"{what} gives {total} tokens, fewer than one row of data.max_length + 1 = "
                           f"{max_length + 1}: give more text or lower data.max_length")
    rows = -(-(total - 1) // max_length)
    starts = np.arange(rows) * max_length
    lengths = np.minimum(max_length + 1, total - starts).astype(np.int32)
    padded = np.zeros(rows * max_length + 1, np.int32)
    padded[:total] = ids
    index = starts[:, None] + np.arange(max_length + 1)[None, :]
    input_ids = np.where(np.arange(max_length + 1)[None, :] < lengths[:, None], padded[index], 0).astype(np.int32)
    return Encoded(input_ids, np.zeros_like(input_ids), lengths, np.zeros(rows, np.int32))


def next_token_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A batch of packed rows [B, L + 1] -> input_ids [B, L] (every token but the last), labels [B, L] (every
    token but the first) and weight [B, L]: the row's weight where the target is a real token, else 0."""
    real = batch["attention_mask"][:, 1:].astype(np.float32)
    return {"input_ids": np.ascontiguousarray(batch["input_ids"][:, :-1]),
            "labels": np.ascontiguousarray(batch["input_ids"][:, 1:]),
            "weight": real * np.asarray(batch["weight"], np.float32)[:, None]}


def random_windows(ids: np.ndarray, rows: int, width: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """nanoGPT's `get_batch`: `rows` windows of `width` (= L + 1) tokens of the stream `ids` [T] at offsets drawn
    uniformly from [0, T - width] -> input_ids, labels [rows, L] and weight 1."""
    starts = rng.integers(0, len(ids) - width + 1, rows)
    window = ids[starts[:, None] + np.arange(width)[None, :]]
    return {"input_ids": np.ascontiguousarray(window[:, :-1]), "labels": np.ascontiguousarray(window[:, 1:]),
            "weight": np.ones((rows, width - 1), np.float32)}

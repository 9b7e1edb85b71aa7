"""Text for causal-LM training: read, tokenized into one stream of ids, and packed into overlapping rows.

Documents: a `.txt` file is one document, read as it is (newlines are text, as nanoGPT's char-level Shakespeare
reads input.txt); a `.jsonl`, `.csv`, `.tsv` or `.parquet` file gives one document per value of its text column.
When there are several, each is followed by the tokenizer's end-of-text token.

Tokenizers: the checkpoint's (`tokenizer.json`: GPT-2's byte-level BPE, Llama's, ...) without special tokens, or
a `Characters` vocabulary built as nanoGPT's `data/shakespeare_char/prepare.py` builds it: the sorted set of the
training text's characters (plus an end-of-text id when the data has several documents).

Reading: a .txt or .jsonl file streams through `tpuplex prepare`'s code (`CorpusEncoder`, units, worker processes)
into the token cache, so a run's memory does not grow with its corpus; a table is read whole and packed in memory
(`pack_stream`), the same bytes as the cache holds for the same documents.

Packing: the stream is cut into rows of L = `max_length` tokens and read (`NextTokenRows`) as rows of L + 1 tokens
that overlap by one: row i is tokens [i L, i L + L + 1), so a row's inputs are its first L tokens and its targets
its last L, and every token of the stream but the first is predicted exactly once. The last row is shorter (padded,
its padding weighted 0). A split is a range of the stream's tokens (nanoGPT's: the first 90% train).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tpuplex.data.batching import Encoded, token_rows
from tpuplex.data.corpus import UNIT_BYTES, cached_corpus, corpus_files, unit_documents, units_of
from tpuplex.data.prepared_tokens import PreparedTokens, open_tokens
from tpuplex.data.tables import DataFile, read_table
from tpuplex.data.tokenize import load_tokenizer, tokenizer_hash
from tpuplex.errors import DataError, TpuplexError

TASK = "causal_lm"

END_OF_TEXT = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
"""The end-of-text token's spellings (GPT-2, Llama 2, Gemma, Llama 3), when tokenizer_config.json names none."""


def documents(file: DataFile, text_column: str) -> list[str]:
    """A table's documents: the non-blank values of its text column."""
    table = read_table(file, [text_column])
    found = [text for text in ("" if value is None else str(value) for value in table.columns[text_column])
             if text.strip()]
    if not found:
        raise _no_text(file)
    return found


def census(file: DataFile, text_column: str) -> tuple[int, str]:
    """(documents, their sorted set of characters) of a .txt or .jsonl file, read unit by unit in one pass: a
    .jsonl line's text is one document, a .txt file with any text one."""
    filesystem, _ = corpus_files(str(file.path))
    count, characters = 0, set()
    for unit in units_of(filesystem, [str(file.path)], UNIT_BYTES):
        texts = unit_documents(filesystem, unit, text_column, whole_files=True)
        count += len(texts)
        characters.update(*texts)
    if file.path.suffix == ".txt":  # its units' texts are parts of its one document
        count = int(bool("".join(characters).strip()))
    if not count:
        raise _no_text(file)
    return count, "".join(sorted(characters))


def _no_text(file: DataFile) -> TpuplexError:
    return DataError(f"{file.path} has no text ({file.field}): give a file with some text in it")


CHARACTERS_END_OF_TEXT = "<|endoftext|>"
"""The end-of-text token of a character vocabulary's HF tokenizer (`Characters.save_pretrained`): GPT-2's name."""


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

    @property
    def size(self) -> int:
        """The ids it gives: the characters and end-of-text (nanoGPT's vocabulary has no end-of-text id: it
        trains on one document)."""
        return len(self.characters) + 1

    def encode(self, text: str, what: str) -> np.ndarray:
        """int32 ids of `text`; one clear error naming a character the vocabulary lacks."""
        codes = np.frombuffer(text.encode("utf-32-le"), np.uint32)
        table = np.frombuffer(self.characters.encode("utf-32-le"), np.uint32)
        ids = np.searchsorted(table, codes).astype(np.int32)
        unknown = (ids >= len(table)) | (table[np.minimum(ids, len(table) - 1)] != codes)
        if unknown.any():
            character = chr(int(codes[np.argmax(unknown)]))
            raise DataError(f"{what} has the character {character!r}, which the run's character vocabulary (built "
                            "from data.train_file) lacks: train on text that has every character you feed")
        return ids

    def save_pretrained(self, folder: Path) -> None:
        """This vocabulary as an HF tokenizer in `folder` (tokenizer.json, tokenizer_config.json), which
        `AutoTokenizer` loads: each character one token of its id, end-of-text `<|endoftext|>` the last id, texts
        decoded by joining the characters (no spaces put in, none cleaned up)."""
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

        tokenizer = Tokenizer(models.WordLevel({character: index for index, character in enumerate(self.characters)},
                                               unk_token=None))
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tokenizer.decoder = decoders.Fuse()
        tokenizer.add_special_tokens([CHARACTERS_END_OF_TEXT])
        tokenizer.save(str(Path(folder) / "tokenizer.json"))
        settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": CHARACTERS_END_OF_TEXT,
                    "clean_up_tokenization_spaces": False, "model_input_names": ["input_ids", "attention_mask"]}
        (Path(folder) / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")

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

    @property
    def size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, what: str) -> np.ndarray:
        return self.encode_telling_unknown(text)[0]

    def encode_telling_unknown(self, text: str) -> tuple[np.ndarray, str]:
        """(int32 ids of `text`, the characters of `text` the tokenizer encodes as its unknown token): a
        tokenizer without byte fallback has no id for a character its vocabulary lacks (T5's trained on
        Shakespeare has no digits), and decoding drops the unknown token, so a caller says how many there were."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        ids = np.asarray(encoding.ids, np.int32)
        if self.unknown_id is None or not (ids == self.unknown_id).any():
            return ids, ""
        return ids, "".join(text[start:end] for (start, end), token in zip(encoding.offsets, ids, strict=True)
                            if token == self.unknown_id)

    @functools.cached_property
    def unknown_id(self) -> int | None:
        """The id of the tokenizer's unknown token (its model's `unk_id` or `unk_token`), None without one."""
        model = json.loads(self.tokenizer.to_str()).get("model", {})
        if isinstance(model.get("unk_id"), int):
            return model["unk_id"]
        return self.tokenizer.token_to_id(model["unk_token"]) if isinstance(model.get("unk_token"), str) else None

    def decode(self, ids: np.ndarray) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


def encode_counting_unknown(vocabulary: Vocabulary, texts: list[str], what: str) -> list[np.ndarray]:
    """Each text's ids (`what` names them: "the prompt"); the characters a checkpoint's tokenizer has no token for
    (read as its unknown token, and lost from any text written) are counted and said in one line on stderr (a
    character vocabulary refuses them)."""
    if not isinstance(vocabulary, CheckpointTokenizer):
        return [vocabulary.encode(text, what) for text in texts]
    rows, unknown = [], ""
    for text in texts:
        ids, lacking = vocabulary.encode_telling_unknown(text)
        rows.append(ids)
        unknown += lacking
    if unknown:
        print(f"tpuplex: {unknown_note(unknown, what)}", file=sys.stderr, flush=True)
    return rows


def unknown_note(characters: str, what: str) -> str:
    """One line saying how many `characters` of `what` the tokenizer encodes as its unknown token, and which."""
    distinct = "".join(sorted(set(characters)))
    shown = repr(distinct[:20]) + (" and more" if len(distinct) > 20 else "")
    return (f"the tokenizer has no token for {len(characters):,} character(s) of {what} ({shown}): they are read as "
            "its unknown token and do not come back in written text; use a tokenizer whose vocabulary has them")


Vocabulary = Characters | CheckpointTokenizer


def stream(texts: list[str], vocabulary: Vocabulary, what: str) -> np.ndarray:
    """int32 [T]: the documents' ids concatenated, each followed by end-of-text when there are several."""
    if len(texts) == 1:
        return vocabulary.encode(texts[0], what)
    end = vocabulary.end_of_text
    if end is None:
        raise DataError(f"{what} has {len(texts)} documents, but the tokenizer has no end-of-text token to mark "
                        f"where one ends ({', '.join(END_OF_TEXT)}): give one .txt file, or a tokenizer with one")
    return np.concatenate([np.append(vocabulary.encode(text, what), np.int32(end)) for text in texts])


@dataclasses.dataclass(frozen=True)
class CorpusEncoder:
    """The causal-LM `tpuplex.data.corpus.DocumentEncoder` (of `tpuplex prepare --task causal_lm` and of a run's
    .txt/.jsonl files): a .txt file is one document (its lines as they are), a .jsonl line's text one, each followed
    by end-of-text unless `end_of_text` is False (a run's file of one document, as `stream` reads it). The tokenizer
    is the checkpoint's in `tokenizer_dir`, or the `characters` vocabulary when given. A .txt file is tokenized unit
    by unit (units end at line ends), so no token spans two units. `source` names the text in errors."""

    tokenizer_dir: str
    characters: str = ""
    end_of_text: bool = True
    source: str = "the corpus"
    whole_files: bool = True

    @property
    def record(self) -> dict[str, Any]:
        tokenizer = {"characters": self.characters} if self.characters else tokenizer_hash(Path(self.tokenizer_dir))
        return {"task": TASK, "tokenizer": tokenizer,
                "end_of_text": self.vocabulary().end_of_text if self.end_of_text else None}

    def vocabulary(self) -> Vocabulary:
        return Characters(self.characters) if self.characters else _checkpoint_tokenizer(self.tokenizer_dir)

    def check(self) -> None:
        if self.end_of_text and self.vocabulary().end_of_text is None:
            raise DataError(f"the tokenizer in {self.tokenizer_dir} has no end-of-text token to mark where each "
                            f"document of {self.source} ends ({', '.join(END_OF_TEXT)}): use a tokenizer that "
                            "has one (a run on one .txt file needs none)")

    def encode(self, documents: list[str], ends: list[bool]) -> np.ndarray:
        vocabulary, pieces = self.vocabulary(), []
        for text, closes in zip(documents, ends, strict=True):
            pieces.append(vocabulary.encode(text, self.source))
            if closes and self.end_of_text:
                pieces.append(np.array([vocabulary.end_of_text], np.int32))
        return np.concatenate(pieces).astype(np.int32) if pieces else np.zeros(0, np.int32)


@functools.lru_cache(maxsize=2)
def _checkpoint_tokenizer(folder: str) -> CheckpointTokenizer:
    return CheckpointTokenizer(Path(folder))


def cached_stream(file: DataFile, vocabulary: Vocabulary, documents: int, tokenizer_dir: Path, max_length: int,
                  cache_dir: Path, text_column: str, fingerprint: str) -> PreparedTokens:
    """The .txt/.jsonl `file` (`documents` of them) tokenized with `vocabulary` and packed into rows of
    `max_length` through `prepare`'s code into the token cache: `stream`'s ids, read in units."""
    encoder = CorpusEncoder(str(tokenizer_dir), vocabulary.characters if isinstance(vocabulary, Characters) else "",
                            documents > 1, str(file.path))
    return cached_corpus(str(file.path), cache_dir, f"{TASK}-{file.path.stem}", fingerprint, encoder, max_length,
                         text_column)


def prepared_corpus(field: str, spec: str, tokenizer_dir: Path, max_length: int) -> PreparedTokens:
    """A corpus `tpuplex prepare --task causal_lm` packed, checked against the run's tokenizer and max_length."""
    prepared = open_tokens(spec)
    meta = prepared.shards.meta
    again = (f"prepare it again: tpuplex prepare FILES --task causal_lm --tokenizer {tokenizer_dir} --max-length "
             f"{max_length}")
    if not meta.get("packed") or meta.get("task") != TASK:
        raise DataError(f"{field} = {spec!r} is a prepared folder but not a causal-LM corpus: {again}")
    if meta["max_length"] != max_length:
        raise DataError(f"{field} = {spec!r} was packed into rows of {meta['max_length']} tokens, but "
                        f"data.max_length is {max_length}: set data.max_length = {meta['max_length']} or {again}")
    if meta["tokenizer"] != tokenizer_hash(tokenizer_dir):
        raise DataError(f"{field} = {spec!r} was tokenized with another tokenizer than {tokenizer_dir}'s: {again}")
    return prepared


@dataclasses.dataclass(frozen=True)
class NextTokenRows:
    """The tokens [first, stop) of a stream packed into rows of L tokens (`source`: an `Encoded` in memory, or a
    prepared corpus), read as rows of L + 1 tokens overlapping by one (see the module). The Batcher batches it as it
    batches an `Encoded`."""

    source: Encoded | PreparedTokens
    first: int = 0
    stop: int = -1
    """-1: to the source's last token."""

    @functools.cached_property
    def end(self) -> int:
        return int(self.source.lengths.sum()) if self.stop < 0 else self.stop

    @property
    def token_count(self) -> int:
        """The stream's tokens."""
        return self.end - self.first

    @property
    def max_length(self) -> int:
        return self.source.max_length + 1

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        """int32 [N]: each row's tokens (L + 1, the last row fewer)."""
        rows = max(0, -(-(self.token_count - 1) // self.source.max_length))
        return np.minimum(self.max_length, self.token_count - np.arange(rows) * self.source.max_length).astype(
            np.int32)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def max_token_id(self) -> int:
        return self.source.max_token_id

    @property
    def read_stats(self) -> Any:
        return getattr(self.source, "read_stats", None)

    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.source.fingerprint()} tokens {self.first} {self.end} +1".encode()).hexdigest()

    def check(self, what: str) -> NextTokenRows:
        """Itself, if it fills at least one row of L + 1 tokens; else one clear error naming `what`."""
        if self.token_count <= self.source.max_length:
            raise DataError(f"{what} gives {self.token_count} tokens, fewer than one row of data.max_length + 1 = "
                            f"{self.max_length}: give more text or lower data.max_length")
        return self

    def rows(self, indices: np.ndarray, length: int) -> dict[str, np.ndarray]:
        """As `Encoded.rows`: rows `indices` [b] of L + 1 tokens, cut to `length`."""
        indices = np.asarray(indices)
        ids = self._windows(indices * self.source.max_length, self.max_length)
        lengths = self.lengths[indices]
        ids = np.where(np.arange(self.max_length)[None, :] < lengths[:, None], ids, 0)
        return token_rows(ids, np.zeros_like(ids), lengths, np.zeros(len(indices), np.int32), length)

    def windows(self, starts: np.ndarray, width: int) -> np.ndarray:
        """int32 [n, width]: the stream's tokens [s, s + width) for each start s (s + width <= token_count, width
        <= L + 1)."""
        return self._windows(np.asarray(starts), width)

    def _windows(self, starts: np.ndarray, width: int) -> np.ndarray:
        """As `windows`, where tokens past the stream's end may be read (the caller masks them)."""
        rows, offsets = np.divmod(self.first + starts, self.source.max_length)
        following = np.minimum(rows + 1, len(self.source) - 1)  # the source's last row: never read past its end
        read = self.source.rows(np.concatenate([rows, following]), self.source.max_length)["input_ids"]
        pairs = np.concatenate([read[: len(rows)], read[len(rows) :]], axis=1)
        return np.take_along_axis(pairs, offsets[:, None] + np.arange(width)[None, :], axis=1).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class WindowSlots(NextTokenRows):
    """The training stream under random-window sampling as the Batcher sees it: the stream's rows, so an epoch is
    as many steps as under "epochs" sampling, but none read: each a full row of zeros (`random_windows` draws the
    step's tokens; reading the rows it threw away took a third of the input's 0.4 ms a step in nanoGPT's CPU
    recipe)."""

    def rows(self, indices: np.ndarray, length: int) -> dict[str, np.ndarray]:
        zeros = np.zeros((len(indices), length), np.int32)
        return token_rows(zeros, zeros, np.full(len(indices), length), np.zeros(len(indices), np.int32), length)


def next_token_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A batch of packed rows [B, L + 1] -> input_ids [B, L] (every token but the last), labels [B, L] (every
    token but the first) and weight [B, L]: the row's weight where the target is a real token, else 0."""
    real = batch["attention_mask"][:, 1:].astype(np.float32)
    return {"input_ids": np.ascontiguousarray(batch["input_ids"][:, :-1]),
            "labels": np.ascontiguousarray(batch["input_ids"][:, 1:]),
            "weight": real * np.asarray(batch["weight"], np.float32)[:, None]}


def random_windows(stream: NextTokenRows, rows: int, width: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """nanoGPT's `get_batch`: `rows` windows of `width` (= L + 1) tokens of the stream (T tokens) at offsets drawn
    uniformly from [0, T - width] -> input_ids, labels [rows, L] and weight 1."""
    window = stream.windows(rng.integers(0, stream.token_count - width + 1, rows), width)
    return {"input_ids": np.ascontiguousarray(window[:, :-1]), "labels": np.ascontiguousarray(window[:, 1:]),
            "weight": np.ones((rows, width - 1), np.float32)}

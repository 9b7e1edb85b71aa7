"""Tagged sentences for token classification: read, checked, and aligned to the checkpoint's sub-tokens.

Files: CoNLL layout (any suffix but .jsonl/.parquet): one word per line, its columns separated by tabs or spaces,
the word in the first column and the tag in `[task] tag_column` (-1: the last); a blank (or whitespace-only) line
ends a sentence; `-DOCSTART-` lines are skipped. JSONL / parquet: one sentence per record, a list of words and a
list of tags (`[task] words_field`, `tags_field`). A test file may have no tags (one column per line, or no tags
field): it can be predicted, not scored.

Alignment (HF `run_ner`'s `tokenize_and_align_labels`): the words are split into sub-tokens by the checkpoint's
tokenizer ([CLS] sub-tokens [SEP]); the first sub-token of each word carries the word's tag, every other position
is not scored (label -1), unless `label_all_tokens`: then a word's later sub-tokens carry its tag too, B- turned
into I-. A sentence longer than `data.max_length` is cut; the words cut off (and words the tokenizer turns into no
sub-token at all) have no position: they are predicted O and still counted by the metrics (`word_starts` -1).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tpuplex.data.batching import Encoded
from tpuplex.data.tables import DataFile, read_table, resolve_file
from tpuplex.errors import DataError, absence
from tpuplex.text_files import read_utf8

PAD_ID = 0
NOT_SCORED = -1
"""The label of a position the loss and the metrics skip: later sub-tokens, special tokens, padding."""
TABLE_SUFFIXES = (".jsonl", ".parquet")
DOCUMENT_START = "-DOCSTART-"


@dataclasses.dataclass(frozen=True)
class Sentences:
    """A file's sentences: words [n][words], tags [n][words] (None: a file without tags), and the line each
    sentence starts on (CoNLL; the record number for tables), for messages."""

    path: Path
    words: list[list[str]]
    tags: list[list[str]] | None
    lines: list[int]

    def __len__(self) -> int:
        return len(self.words)


@dataclasses.dataclass(frozen=True)
class Aligned:
    """A split of sentences as the model sees them.

    encoded: token ids [N, max_length] with labels int32 [N, max_length] (the tag id on scored positions, -1
    elsewhere). word_starts[n]: int32 [words of sentence n], the position of each word's first sub-token, -1 for a
    word cut off at max_length or with no sub-token. tag_ids[n]: int32 [words], the gold tags (None: untagged).
    """

    sentences: Sentences
    encoded: Encoded
    word_starts: list[np.ndarray]
    tag_ids: list[np.ndarray] | None

    @property
    def cut_words(self) -> int:
        """Words with no position (cut off at max_length, or no sub-token)."""
        return int(sum(int((starts < 0).sum()) for starts in self.word_starts))

    @property
    def cut_sentences(self) -> int:
        return int(sum(bool((starts < 0).any()) for starts in self.word_starts))


def data_file(field: str, spec: str) -> DataFile:
    """`spec` as a DataFile: tables for .jsonl/.parquet (and datasets folders), CoNLL text otherwise."""
    path = Path(spec).expanduser()
    if path.suffix in TABLE_SUFFIXES or path.is_dir() or not path.suffix and ":" in spec:
        return resolve_file(field, spec)
    if not path.is_file():
        raise DataError(f"{field} = {spec!r} {absence(path)}: give the path of a CoNLL file (one word and its "
                        "tag per line) or of a .jsonl file")
    return DataFile(field, spec, path, ".conll", path.stem)


def read_sentences(file: DataFile, tag_column: int, words_field: str, tags_field: str,
                   require_tags: bool = True) -> Sentences:
    """Every sentence of `file`; `require_tags` False reads tags only where the file has them (a test file)."""
    if file.kind == ".conll":
        found = _read_conll(file.path, tag_column, require_tags)
    else:
        found = _read_table(file, words_field, tags_field, require_tags)
    if not len(found):
        raise DataError(f"{file.path} holds no sentences ({file.field}): give a file with at least one "
                        "tagged word")
    return found


def _read_conll(path: Path, tag_column: int, require_tags: bool) -> Sentences:
    words: list[list[str]] = []
    tags: list[list[str]] = []
    lines: list[int] = []
    has_tags: bool | None = None
    sentence_words: list[str] = []
    sentence_tags: list[str] = []
    for number, line in enumerate([*read_utf8(path).split("\n"), ""], start=1):
        columns = line.split()
        if not columns or columns[0] == DOCUMENT_START:
            if sentence_words:
                words.append(sentence_words)
                tags.append(sentence_tags)
                sentence_words, sentence_tags = [], []
            continue
        if not sentence_words:
            lines.append(number)
        if has_tags is None:
            has_tags = len(columns) > 1 or require_tags
        if has_tags:
            resolved = tag_column if tag_column >= 0 else len(columns) + tag_column
            if not 0 < resolved < len(columns):
                raise DataError(f"{path} line {number} has {len(columns)} column(s) and no tag in column "
                                f"{tag_column} (task.tag_column): write the word and its tag on each line, "
                                "separated by a tab or spaces")
            sentence_tags.append(columns[resolved])
        sentence_words.append(columns[0])
    return Sentences(path, words, tags if has_tags else None, lines)


def _read_table(file: DataFile, words_field: str, tags_field: str, require_tags: bool) -> Sentences:
    table = read_table(file, [words_field, *([tags_field] if require_tags else [])],
                       [] if require_tags else [tags_field])
    numbers = table.lines or list(range(len(table)))
    where = "line" if table.lines else "row"
    words, tags = [], [] if tags_field in table.columns else None
    for row, number in enumerate(numbers):
        sentence = table.columns[words_field][row]
        if not _is_strings(sentence) or not sentence:
            raise DataError(f"{file.path} {where} {number}: {words_field!r} is not a non-empty list of words: "
                            f'write e.g. {{"{words_field}": ["EU", "rejects"], "{tags_field}": ["B-ORG", "O"]}}')
        words.append(list(sentence))
        if tags is not None:
            sentence_tags = table.columns[tags_field][row]
            if not _is_strings(sentence_tags) or len(sentence_tags) != len(sentence):
                raise DataError(f"{file.path} {where} {number}: {tags_field!r} is not a list of one tag per word "
                                f"({len(sentence)} words): give each word its tag")
            tags.append(list(sentence_tags))
    return Sentences(file.path, words, tags, numbers)


def _is_strings(value: object) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(item, str) for item in value)


def tag_set(sentences: Sentences) -> tuple[str, ...]:
    """The tags of a training file, sorted (HF run_ner's label list)."""
    return tuple(sorted({tag for tags in sentences.tags or [] for tag in tags}))


def check_tags(sentences: Sentences, tags: tuple[str, ...], what: str) -> None:
    """A TpuplexError naming the first sentence (file and line) with a tag outside `tags`."""
    known = set(tags)
    for sentence, line in zip(sentences.tags or [], sentences.lines, strict=False):
        unknown = sorted(set(sentence) - known)
        if unknown:
            raise DataError(f"{sentences.path} sentence at line {line} has the tag {unknown[0]!r}, which is not in "
                            f"the {what} ({', '.join(tags)}): fix the tag, or list every tag in task.tags")


def align(sentences: Sentences, tokenizer: Tokenizer, max_length: int, tags: tuple[str, ...],
          label_all_tokens: bool = False) -> Aligned:
    """Tokenize pre-split words and align their tags to sub-tokens (see the module doc). `tokenizer` truncates
    to `max_length` (`tpuplex.data.tokenize.load_tokenizer`)."""
    tag_index = {tag: index for index, tag in enumerate(tags)}
    inside = np.array([tag_index.get("I-" + tag[2:], index) if tag.startswith("B-") else index
                       for index, tag in enumerate(tags)], np.int32)
    count = len(sentences)
    input_ids = np.full((count, max_length), PAD_ID, np.int32)
    type_ids = np.zeros((count, max_length), np.int32)
    labels = np.full((count, max_length), NOT_SCORED, np.int32)
    lengths = np.zeros(count, np.int32)
    word_starts, tag_ids = [], None if sentences.tags is None else []
    for row, encoding in enumerate(tokenizer.encode_batch(sentences.words, is_pretokenized=True)):
        length = len(encoding.ids)
        input_ids[row, :length], type_ids[row, :length], lengths[row] = encoding.ids, encoding.type_ids, length
        word_of = np.array([-1 if word is None else word for word in encoding.word_ids], np.int64)
        words = len(sentences.words[row])
        starts = np.full(words, -1, np.int32)
        first = np.flatnonzero((word_of >= 0) & (word_of != np.r_[-1, word_of[:-1]]))
        starts[word_of[first]] = first
        word_starts.append(starts)
        if tag_ids is not None:
            gold = np.array([tag_index[tag] for tag in sentences.tags[row]], np.int32)
            tag_ids.append(gold)
            labels[row, first] = gold[word_of[first]]
            if label_all_tokens:
                later = np.setdiff1d(np.flatnonzero(word_of >= 0), first)
                labels[row, later] = inside[gold[word_of[later]]]
    return Aligned(sentences, Encoded(input_ids, type_ids, lengths, labels), word_starts, tag_ids)

"""Token classification (`AutoModelForTokenClassification`): one tag per word, e.g. named entities.

    [task]
    name = "token_classification"
    tags = []                       # the tag set in id order; empty: the training file's tags, sorted (HF run_ner)
    tag_column = -1                 # CoNLL files: the column of the tag (the word is column 0; -1: the last)
    label_all_tokens = false        # train on every sub-token of a word, not only the first
    words_field = "tokens"          # .jsonl / .parquet files: the list of words and the list of tags
    tags_field = "tags"

    [data]
    dataset = "wnut17"              # a name (runtime.output_dir's {dataset})
    train_file = "wnut17train.conll"
    eval_files = ["emerging.dev.conll"]
    test_file = "emerging.test.annotated"

Batches: the Batcher's rows with labels int32 [B, L] (the tag of each word's first sub-token, -1 elsewhere) and
weight [B, L] (1 on scored positions). Loss: per-token cross-entropy. Metrics per split, at the level of words
(`entities.py`, equal to seqeval's default mode): entity `precision`, `recall`, `f1` overall and per type,
word `accuracy`, the mean `loss` over scored tokens, and `cut_words` (words past max_length, predicted O and counted
as such). The tag set is recorded in the run (run.json), so eval, predict and export use the same ids. Predictions:
one CoNLL file per split, `word<TAB>gold<TAB>predicted` (no gold column for an untagged file), one line per word.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex import tasks
from tpuplex.data.batching import Encoded
from tpuplex.data.tables import DataFile
from tpuplex.data.tokenize import cached_split, load_tokenizer
from tpuplex.errors import TpuplexError
from tpuplex.metrics import cross_entropy
from tpuplex.models import Architecture, Family
from tpuplex.protocol import Batch
from tpuplex.tasks.base import (
    Task,
    TaskData,
    check_inputs,
    check_split_names,
    framework_modules,
    matmul_weights,
    probabilities,
    scored_label,
)
from tpuplex.tasks.token_classification import data as tagged
from tpuplex.tasks.token_classification.entities import check_scheme, scores
from tpuplex.tasks.token_classification.heads import FAMILY_HEADS, TokenClassifierHead, token_classifier_head
from tpuplex.text_files import staged_text

OUTSIDE = "O"


@dataclasses.dataclass(frozen=True)
class Options:
    tags: tuple[str, ...] = ()
    tag_column: int = -1
    label_all_tokens: bool = False
    words_field: str = "tokens"
    tags_field: str = "tags"


@dataclasses.dataclass
class TokenData(TaskData):
    name: str
    train: Encoded
    eval: dict[str, Encoded]
    tags: tuple[str, ...]
    aligned: dict[str, tagged.Aligned]
    """Every split's sentences and alignment, by split name (train, each eval split, test)."""
    test: Encoded | None = None
    per_token: ClassVar[bool] = True

    def train_batch(self, batch: Batch, step: int) -> Batch:
        return scored(batch)

    def eval_batch(self, batch: Batch, index: np.ndarray) -> Batch:
        return scored(batch)

    def metrics(self, split: str, outputs: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> dict[str, float]:
        """outputs: logits [N, max_length, T]; metrics at the level of words (see the module doc)."""
        aligned = self.aligned[split]
        predicted = self.word_tags(aligned, outputs)
        gold = [[self.tags[tag] for tag in sentence] for sentence in aligned.tag_ids]
        loss = float((weight * cross_entropy(outputs, labels)).sum() / max(float(weight.sum()), 1.0))
        return {**scores(gold, predicted), "loss": loss, "cut_words": float(aligned.cut_words)}

    def word_tags(self, aligned: tagged.Aligned, outputs: np.ndarray) -> list[list[str]]:
        """Each word's predicted tag: the argmax at its first sub-token, O for a word with no position."""
        best = outputs.argmax(axis=-1)
        return [[self.tags[best[row, start]] if start >= 0 else OUTSIDE for start in starts]
                for row, starts in enumerate(aligned.word_starts)]

    def pinned_options(self) -> dict[str, Any]:
        return {"tags": list(self.tags)}

    def report(self) -> dict[str, Any]:
        return {"tags": list(self.tags),
                **{split: {"sentences": len(found.sentences), "words": sum(map(len, found.word_starts)),
                           "cut_sentences": found.cut_sentences, "cut_words": found.cut_words}
                   for split, found in self.aligned.items()}}


def scored(batch: Batch) -> Batch:
    """Labels -1 (not scored) become weight 0 (and label 0, a valid id for the loss to ignore)."""
    labels = batch["labels"]
    weight = (labels >= 0).astype(np.float32) * np.asarray(batch["weight"], np.float32)[:, None]
    return {**batch, "labels": np.maximum(labels, 0).astype(np.int32), "weight": weight}


class TokenClassification(Task):
    name: ClassVar[str] = "token_classification"
    Options: ClassVar[type] = Options
    backends: ClassVar[Mapping[str, str]] = framework_modules(__name__)
    auto_class: ClassVar[str] = "AutoModelForTokenClassification"

    def check(self, config: Any, options: Options) -> None:
        if not config.data.train_file:
            raise TpuplexError("data.train_file is empty: the token_classification task trains on tagged words, e.g. "
                               'train_file = "train.conll" (one word and its tag per line)')
        if not config.data.eval_files:
            raise TpuplexError("data.eval_files is empty: give the token_classification task at least one tagged "
                               'file to evaluate on, e.g. eval_files = ["dev.conll"]')
        if options.tags:
            check_scheme(options.tags, "task.tags")
        self._files(config)

    def metric_names(self, config: Any, options: Options) -> dict[str, tuple[str, ...]]:
        """Each tagged evaluation file's entity scores, overall and per entity type (`PER/f1`: the types are the
        data's), word `accuracy`, `loss` and `cut_words`."""
        test = "test" if config.data.test_file else None  # the one split that is not evaluated
        splits = [name for name in self._files(config) if name not in ("train", test)]
        per_type = tuple(f"*/{name}" for name in ("precision", "recall", "f1", "support"))
        return dict.fromkeys(splits, ("precision", "recall", "f1", "accuracy", "loss", "cut_words", *per_type))

    def prepare(self, config: Any, options: Options, tokenizer_dir: Path) -> TokenData:
        files = self._files(config)
        test = "test" if config.data.test_file else None  # the one split that may have no tags
        evaluated = [split for split in files if split not in ("train", test)]
        sentences = {split: self._read(file, options, require_tags=split != test) for split, file in files.items()}
        tags = options.tags or tagged.tag_set(sentences["train"])
        check_scheme(tags, "task.tags" if options.tags else f"{files['train'].path}")
        for found in sentences.values():
            tagged.check_tags(found, tags, "task.tags" if options.tags else "training file's tags")
        tokenizer = load_tokenizer(tokenizer_dir, config.data.max_length)
        aligned = {split: tagged.align(found, tokenizer, config.data.max_length, tags,
                                       options.label_all_tokens and split == "train")
                   for split, found in sentences.items()}
        _check_words_kept(aligned["train"], config.data.max_length)
        cache = Path(config.data.cache_dir).expanduser()
        # The words and their alignment stay in memory (word-level metrics need them); the rows a run batches are
        # read from prepared shards, as every task's.
        prepared = {split: cached_split(found.encoded, cache, f"{self.name}-{split}")
                    for split, found in aligned.items()}
        evaluation = {split: rows for split, rows in prepared.items() if split in evaluated}
        return TokenData(config.data.dataset, prepared["train"], evaluation, tags, aligned,
                         prepared[test] if test else None)

    def head(self, family: Family | None, arch: Architecture | None, hf_config: Mapping[str, Any],
             data: TokenData) -> TokenClassifierHead:
        return token_classifier_head(family, arch, hf_config, len(data.tags))

    def head_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        """The classifier at every position."""
        return 2.0 * np.size(batch["input_ids"]) * matmul_weights(spec.head.shapes)

    def hf_class(self, family: Family, model_type: str) -> str:
        return FAMILY_HEADS[family.name].hf_classes[family.model_types.index(model_type)]

    def export_config(self, config: Any) -> dict[str, Any]:
        tags = config.task.options.get("tags") or ()
        return {"id2label": dict(enumerate(tags)), "label2id": {tag: i for i, tag in enumerate(tags)}}

    def prediction_sources(self, config: Any, split: str) -> dict[str, tagged.Sentences]:
        """The sentences of eval split `split`, or of data.test_file ("test"), read and checked against the run's
        tag set."""
        options = tasks.options(self, config.task.options)
        files = {name: file for name, file in self._files(config).items() if name != "train"}
        if split not in files:
            raise TpuplexError(f"the run has no split {split!r} to predict: use one of {', '.join(files)}"
                               + ("" if "test" in files else " (or set data.test_file for test)"))
        found = self._read(files[split], options, require_tags=False)
        tagged.check_tags(found, tuple(options.tags), "run's tag set")
        return {split: found}

    def write_predictions(self, experiment: Any, state: Any, sources: dict[str, tagged.Sentences], out: Path,
                          write: bool) -> dict[str, Path]:
        data, trainer, config = experiment.data, experiment.trainer, experiment.config
        tokenizer = load_tokenizer(experiment.model_dir, config.data.max_length)
        written = {}
        for split, sentences in sources.items():
            aligned = tagged.align(sentences, tokenizer, config.data.max_length, data.tags)
            logits, _ = trainer.predict(state, trainer.batcher(aligned.encoded))
            if write:
                written[split] = _write_conll(out / f"{split}.conll", sentences, data.word_tags(aligned, logits))
        return written

    def prediction_inputs(self, config: Any, inputs: Sequence[Any]) -> tagged.Sentences:
        """Sentences: a string (its words split at whitespace) or a list of words."""
        sentences = check_inputs(inputs, str | list | tuple, "sentences: strings, or lists of words")
        words = [sentence.split() if isinstance(sentence, str) else [str(word) for word in sentence]
                 for sentence in sentences]
        return tagged.Sentences(Path("inputs"), words, None, list(range(len(words))))

    def predictions_of(self, experiment: Any, state: Any, inputs: tagged.Sentences) -> list[list[tuple[str, str]]]:
        """Each sentence's (word, tag) pairs."""
        aligned, logits = _logits_of(experiment, state, inputs)
        return [list(zip(words, tags, strict=True))
                for words, tags in zip(inputs.words, experiment.data.word_tags(aligned, logits), strict=True)]

    def scored_predictions_of(self, experiment: Any, state: Any,
                              inputs: tagged.Sentences) -> list[list[dict[str, Any]]]:
        """Each sentence's words as records: `word`, `tag`, `score` (the tag's probability at the word's first
        sub-token) and `scores` (every tag's); a word cut off at max_length is tagged O with `score` and `scores`
        None."""
        aligned, logits = _logits_of(experiment, state, inputs)
        tags, chances = experiment.data.tags, probabilities(logits)

        def record(word: str, row: int, start: int) -> dict[str, Any]:
            if start < 0:
                return {"word": word, "tag": OUTSIDE, "score": None, "scores": None}
            scored = scored_label(chances[row, start], tags)
            return {"word": word, "tag": scored["label"], "score": scored["score"], "scores": scored["scores"]}

        return [[record(word, row, int(start)) for word, start in zip(words, starts, strict=True)]
                for row, (words, starts) in enumerate(zip(inputs.words, aligned.word_starts, strict=True))]

    def _files(self, config: Any) -> dict[str, DataFile]:
        """train, each eval file (by its name: `devel.tsv` is the split "devel", `test.tsv` "test") and
        data.test_file ("test"), each existing. Only two files that would be one split are refused."""
        data = config.data
        train = tagged.data_file("data.train_file", data.train_file)
        held_out = [tagged.data_file(f"data.eval_files[{index}]", spec) for index, spec in enumerate(data.eval_files)]
        check_split_names(data.eval_files, [file.name for file in held_out])
        files = {"train": train} | {file.name: file for file in held_out}
        if data.test_file:
            if "test" in files:
                raise TpuplexError(f"data.eval_files holds a file {files['test'].spec!r} and data.test_file = "
                                   f"{data.test_file!r}: both would be the split 'test': evaluate a labelled test "
                                   "file through data.eval_files alone, or rename one of the files")
            files["test"] = tagged.data_file("data.test_file", data.test_file)
        return files

    def _read(self, file: DataFile, options: Options, require_tags: bool) -> tagged.Sentences:
        return tagged.read_sentences(file, options.tag_column, options.words_field, options.tags_field, require_tags)


def _logits_of(experiment: Any, state: Any, inputs: tagged.Sentences) -> tuple[tagged.Aligned, np.ndarray]:
    """Sentences given in memory aligned to the run's tokenizer, and their logits [N, max_length, tags]."""
    data, trainer, max_length = experiment.data, experiment.trainer, experiment.config.data.max_length
    aligned = tagged.align(inputs, load_tokenizer(experiment.model_dir, max_length), max_length, data.tags)
    return aligned, trainer.predict(state, trainer.batcher(aligned.encoded))[0]


def _check_words_kept(train: tagged.Aligned, max_length: int) -> None:
    """A max_length that leaves most training sentences without a single word would train on (almost) nothing."""
    kept = sum(bool((starts >= 0).any()) for starts in train.word_starts)
    if 2 * kept < len(train.word_starts):
        raise TpuplexError(f"data.max_length = {max_length} keeps no word of {len(train.word_starts) - kept} of the "
                           f"{len(train.word_starts)} training sentences ({train.cut_words} words cut): raise "
                           "data.max_length (128 keeps whole sentences of most corpora)")


def _write_conll(path: Path, sentences: tagged.Sentences, predicted: list[list[str]]) -> Path:
    """word<TAB>gold<TAB>predicted per line (no gold column without tags), a blank line after each sentence;
    written beside `path` and renamed into place."""
    with staged_text(path) as staging:
        for row, words in enumerate(sentences.words):
            gold = sentences.tags[row] if sentences.tags is not None else None
            for position, word in enumerate(words):
                columns = [word, *([gold[position]] if gold is not None else []), predicted[row][position]]
                staging.write("\t".join(columns) + "\n")
            staging.write("\n")
    return path


TASK = TokenClassification()

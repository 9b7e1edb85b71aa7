"""Text to text (`AutoModelForSeq2SeqLM`): an encoder-decoder (`tpuplex.kinds.encoder_decoder`: T5) reads an input
text and learns to write a target text, every task as text, as T5 was trained.

    [task]
    name = "seq2seq"
    input_template = "summarize: {{ article }}"   # jinja2 over a table's columns (data.train_file, eval_files)
    target_template = "{{ highlights }}"
    max_target_length = 0                         # targets' length in tokens (0: the longest target of the data)

    [data]
    train_file = "train.jsonl"                    # a table (.tsv, .csv, .jsonl, .parquet), one example a row
    max_length = 512                              # inputs' length: longer inputs are cut (their end-of-text kept)

Without data.train_file, `data.dataset` names a GLUE dataset (`data.data_dir` its files, as the sequence
classification task reads them), written as T5 wrote it: `mrpc sentence1: ... sentence2: ...` -> `equivalent`.

Batches: input_ids, attention_mask [B, S] (S a bucket of data.max_length), decoder_input_ids [B, T] (the targets
shifted right behind the model's decoder start id), labels [B, T], weight [B, T] (1 on each target token and its
end-of-text). Evaluation reads every target once: `loss` (cross-entropy per target token), `token_accuracy`, and
`exact_match`, the rows whose every target token is the most likely one given the ones before it, which is
exactly the rows greedy decoding writes right; a GLUE dataset adds its official metrics of the class each row's
text names (`accuracy`, and F1 or MCC, a wrong text counting as the wrong class, as T5's postprocessors do).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex import metrics as scores
from tpuplex.data.batching import Encoded
from tpuplex.data.tables import read_table, resolve_file
from tpuplex.errors import DataError, TpuplexError
from tpuplex.hosts import expected_process_index
from tpuplex.models import Architecture, Family
from tpuplex.models.t5 import INPUTS, shift_right
from tpuplex.protocol import Batch, Prompts
from tpuplex.tasks.base import Head, Task, TaskData, check_inputs, check_split_names, framework_modules
from tpuplex.tasks.causal_lm.chat import render_row, row_templates
from tpuplex.tasks.causal_lm.data import CheckpointTokenizer, encode_counting_unknown, unknown_note
from tpuplex.tasks.sequence_classification.glue import GlueData, get_dataset
from tpuplex.text_files import staged_text

T5_GLUE: Mapping[str, tuple[str, Mapping[str, str]]] = {
    "mrpc": ("mrpc sentence1: {{ a }} sentence2: {{ b }}", {"0": "not_equivalent", "1": "equivalent"}),
    "rte": ("rte sentence1: {{ a }} sentence2: {{ b }}",
            {"entailment": "entailment", "not_entailment": "not_entailment"}),
    "wnli": ("wnli sentence1: {{ a }} sentence2: {{ b }}", {"0": "not_entailment", "1": "entailment"}),
    "sst2": ("sst2 sentence: {{ a }}", {"0": "negative", "1": "positive"}),
    "cola": ("cola sentence: {{ a }}", {"0": "unacceptable", "1": "acceptable"}),
    "qnli": ("qnli question: {{ a }} sentence: {{ b }}",
             {"entailment": "entailment", "not_entailment": "not_entailment"}),
    "qqp": ("qqp question1: {{ a }} question2: {{ b }}", {"0": "not_duplicate", "1": "duplicate"}),
    "mnli": ("mnli hypothesis: {{ b }} premise: {{ a }}",
             {"entailment": "entailment", "neutral": "neutral", "contradiction": "contradiction"}),
}
"""The GLUE datasets as T5 wrote them (its `glue` preprocessors): the input over the first and second texts (a, b),
and each label's word."""

IGNORED = -1
"""A label past a target's end: weight 0, read as padding."""


@dataclasses.dataclass(frozen=True)
class Options:
    input_template: str = ""
    target_template: str = ""
    max_target_length: int = 0


class TextPairs(Encoded):
    """Inputs as an `Encoded` split (input_ids [N, max_length], lengths [N]) with their targets as labels [N, T]
    (IGNORED past each target's end), kept whole whatever bucket the inputs are cut to."""

    @property
    def max_token_id(self) -> int:
        return int(max(self.input_ids.max(initial=0), self.labels.max(initial=0)))

    def rows(self, indices: np.ndarray, length: int) -> dict[str, np.ndarray]:
        lengths = self.lengths[indices]
        return {"input_ids": np.ascontiguousarray(self.input_ids[indices, :length], np.int32),
                "attention_mask": (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32),
                "labels": np.ascontiguousarray(self.labels[indices])}


@dataclasses.dataclass
class Seq2SeqData(TaskData):
    name: str
    train: TextPairs | None
    eval: dict[str, TextPairs]
    vocabulary: CheckpointTokenizer
    start_id: int
    pad_id: int
    classes: np.ndarray | None = None
    """A GLUE dataset's words as token rows [C, T] (IGNORED after each), to read a row's class from its target."""
    glue: str = ""
    cut_inputs: int = 0
    unknown_characters: int = 0
    """Characters of the data the tokenizer has no token for (read as its unknown token)."""
    per_token: ClassVar[bool] = True

    def train_batch(self, batch: Batch, step: int) -> Batch:
        return self.teacher_forced(batch)

    def eval_batch(self, batch: Batch, index: np.ndarray) -> Batch:
        return self.teacher_forced(batch)

    def teacher_forced(self, batch: Batch) -> Batch:
        """The Batcher's rows (weight [B]) -> decoder_input_ids, labels, weight [B, T]: each target token weighed
        by its row."""
        labels = np.asarray(batch["labels"])
        real = labels != IGNORED
        targets = np.where(real, labels, self.pad_id).astype(np.int32)
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                "decoder_input_ids": shift_right(targets, self.start_id), "labels": targets,
                "weight": real * np.asarray(batch["weight"], np.float32)[:, None]}

    def metrics(self, split: str, outputs: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> dict[str, float]:
        """outputs [N, T, 2]: each target token's cross-entropy and whether it is the most likely token."""
        total = max(float(weight.sum()), 1.0)
        loss = float((weight * outputs[..., 0]).sum() / total)
        exact = np.all((outputs[..., 1] > 0) | (weight == 0), axis=1)
        found = {"loss": loss, "token_accuracy": float((weight * outputs[..., 1]).sum() / total),
                 "exact_match": float(exact.mean()) if len(exact) else 0.0}
        if self.classes is None:
            return found
        dataset = get_dataset(self.glue)
        target_class = self.class_of(labels, weight)
        wrong = (target_class + 1) % dataset.num_labels  # a wrong text scores as another class
        predicted = np.where(exact, target_class, wrong)
        one_hot = np.eye(dataset.num_labels, dtype=np.float32)[predicted]
        return {**found, **scores.compute(dataset, one_hot, target_class)}

    def class_of(self, labels: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """int [N]: the class whose word each target row [N, T] is."""
        width = min(labels.shape[1], self.classes.shape[1])
        rows = np.where(weight[:, :width] > 0, labels[:, :width], IGNORED)
        classes = np.where(self.classes[:, :width] == self.pad_id, IGNORED, self.classes[:, :width])
        return np.argmax(np.all(rows[:, None, :] == classes[None], axis=-1), axis=1)

    def vocabulary_size(self) -> int:
        return self.vocabulary.size

    def report(self) -> dict[str, Any]:
        return {"inputs_cut_to_max_length": self.cut_inputs, "unknown_characters": self.unknown_characters}


class Seq2Seq(Task):
    name: ClassVar[str] = "seq2seq"
    Options: ClassVar[type] = Options
    backends: ClassVar[Mapping[str, str]] = framework_modules(__name__)
    auto_class: ClassVar[str] = "AutoModelForSeq2SeqLM"
    model_kinds: ClassVar[tuple[str, ...]] = ("encoder_decoder",)
    inputs: ClassVar[tuple[str, ...]] = INPUTS

    def check(self, config: Any, options: Options) -> None:
        if bool(options.input_template) != bool(options.target_template):
            raise TpuplexError("task.input_template and task.target_template make a table's rows text pairs "
                               "together: set both, or neither (a GLUE data.dataset is written as T5 wrote it)")
        if options.max_target_length < 0:
            raise TpuplexError(f"task.max_target_length = {options.max_target_length}: give a positive number of "
                               "tokens, or 0 for the longest target of the data")
        if config.data.train_file and not options.input_template:
            raise TpuplexError(f"data.train_file = {config.data.train_file!r} is a table: say how its columns "
                               'read as text with task.input_template and task.target_template, e.g. "summarize: '
                               '{{ article }}" and "{{ highlights }}"')
        if not config.data.train_file and config.data.dataset not in T5_GLUE:
            raise TpuplexError(f"data.dataset = {config.data.dataset!r} is not a GLUE dataset T5 wrote as text "
                               f"({', '.join(T5_GLUE)}): name one, or give data.train_file with the templates")

    def metric_names(self, config: Any, options: Options) -> dict[str, tuple[str, ...]]:
        """`loss`, `token_accuracy` and `exact_match` on each evaluation table; a GLUE dataset's evaluation splits add
        its official metrics and `score`."""
        names = ("loss", "token_accuracy", "exact_match")
        if config.data.train_file:
            splits = [resolve_file(f"data.eval_files[{index}]", spec).name
                      for index, spec in enumerate(config.data.eval_files)]
            return dict.fromkeys(splits, names)
        dataset = get_dataset(config.data.dataset)
        return dict.fromkeys(dataset.eval_splits, (*names, *dataset.metrics, "score"))

    def model_data(self, config: Any, options: Options, tokenizer_dir: Path) -> Seq2SeqData:
        """Generation reads no table: the checkpoint's tokenizer and its decoder's start and padding ids."""
        return Seq2SeqData(config.data.dataset, None, {}, *_tokenizer(tokenizer_dir))

    def prepare(self, config: Any, options: Options, tokenizer_dir: Path) -> Seq2SeqData:
        tokenizer, start_id, pad_id = _tokenizer(tokenizer_dir)
        if config.data.train_file:
            splits, glue = self._tables(config, options), ""
        else:
            splits, glue = self._glue(config), config.data.dataset
        eos = tokenizer.end_of_text
        unknown: list[str] = []

        def encode(text: str) -> np.ndarray:
            ids, lacking = tokenizer.encode_telling_unknown(text)
            if lacking:
                unknown.append(lacking)
            return np.append(ids, np.int32(eos))

        encoded = {name: ([encode(text) for text in inputs], [encode(text) for text in targets])
                   for name, (inputs, targets) in splits.items()}
        longest = max(len(target) for _, targets in encoded.values() for target in targets)
        target_length = options.max_target_length or longest
        for name, (_, targets) in encoded.items():
            if (too_long := max(len(target) for target in targets)) > target_length:
                raise DataError(f"a target of the {name} split has {too_long} tokens (with its end-of-text), more "
                                f"than task.max_target_length = {target_length}: raise it to at least {too_long}, "
                                "or 0 to fit the longest target")
        cut = _cut_inputs(encoded, config.data.max_length)
        if missing := "".join(unknown):
            _say(unknown_note(missing, "the data"))
        pairs = {name: _pairs(inputs, targets, config.data.max_length, target_length, eos)
                 for name, (inputs, targets) in encoded.items()}
        classes = None
        if glue:
            words = list(dict.fromkeys(T5_GLUE[glue][1].values()))
            classes = _pairs([encode(word) for word in words], [encode(word) for word in words], 1, target_length,
                             eos).labels
            classes = np.where(classes == IGNORED, pad_id, classes)
        train = pairs.pop("train")
        return Seq2SeqData(config.data.dataset, train, pairs, tokenizer, start_id, pad_id, classes, glue, cut,
                           len(missing))

    @staticmethod
    def _tables(config: Any, options: Options) -> dict[str, tuple[list[str], list[str]]]:
        templates = row_templates({"task.input_template": options.input_template,
                                   "task.target_template": options.target_template})
        files = [("data.train_file", config.data.train_file),
                 *((f"data.eval_files[{index}]", spec) for index, spec in enumerate(config.data.eval_files))]
        resolved = [resolve_file(field, spec) for field, spec in files]
        check_split_names(config.data.eval_files, [file.name for file in resolved[1:]])
        if not config.data.eval_files:
            raise TpuplexError("the seq2seq task evaluates on held-out tables: set data.eval_files")
        columns = sorted(set().union(*(names for _, names in templates.values())))
        splits = {}
        for index, file in enumerate(resolved):
            table = read_table(file, columns)
            rendered: tuple[list[str], list[str]] = ([], [])
            for row in range(len(table)):
                values = {column: values[row] for column, values in table.columns.items()}
                where = f"{table.where(row)} ({file.field})"
                for texts, (template, _) in zip(rendered, templates.values(), strict=True):
                    texts.append(render_row(template, values, where))
                if not rendered[1][-1].strip():
                    raise DataError(f"{where}: task.target_template renders an empty target, nothing to learn: fix "
                                    "the template or the row")
            splits["train" if index == 0 else file.name] = rendered
        return splits

    @staticmethod
    def _glue(config: Any) -> dict[str, tuple[list[str], list[str]]]:
        dataset = get_dataset(config.data.dataset)
        template, words = T5_GLUE[dataset.name]
        compiled = row_templates({"input": template})["input"][0]
        splits = {}
        for split, source in GlueData(dataset, config.data.data_dir).sources().items():
            examples = source.read()
            second = examples.text_b or [""] * len(examples)
            inputs = [compiled.render(a=a, b=b) for a, b in zip(examples.text_a, second, strict=True)]
            splits[split] = (inputs, [words[dataset.labels[label]] for label in examples.labels])
        return splits

    def prediction_sources(self, config: Any, split: str) -> dict[str, str]:
        """`tpuplex predict --split S`: an evaluation split of the run (its GLUE dev split, or an eval file's name);
        its texts are written."""
        names = (["dev"] if not config.data.train_file else
                 [resolve_file(f"data.eval_files[{index}]", spec).name
                  for index, spec in enumerate(config.data.eval_files)])
        if split not in names:
            raise DataError(f"--split {split!r} is not an evaluation split of the run: use one of {', '.join(names)}")
        return {split: split}

    def write_predictions(self, experiment: Any, state: Any, sources: dict[str, str], out: Path,
                          write: bool) -> dict[str, Path]:
        """`<split>.tsv`: each row's input, the text greedy decoding writes for it, and its target."""
        data, written = experiment.data, {}
        for split in sources:
            pairs = data.eval[split]
            texts = written_texts(experiment, state, pairs.input_ids, pairs.lengths, pairs.labels.shape[1])
            if write:
                decode = data.vocabulary.tokenizer.decode
                rows = [(decode(list(map(int, ids[:length])), skip_special_tokens=True), text,
                         decode([int(i) for i in target if i != IGNORED], skip_special_tokens=True))
                        for ids, length, text, target in zip(pairs.input_ids, pairs.lengths, texts, pairs.labels,
                                                             strict=True)]
                path = out / f"{split}.tsv"
                with staged_text(path) as staging:
                    staging.write("input\tprediction\ttarget\n")
                    staging.writelines("\t".join(_one_line(value) for value in row) + "\n" for row in rows)
                written[split] = path
        return written

    def prediction_inputs(self, config: Any, inputs: Sequence[Any]) -> list[str]:
        """Input texts, written as the run's inputs are (a GLUE dataset's: "mrpc sentence1: ... sentence2: ...")."""
        return check_inputs(inputs, str, "input texts: strings")

    def predictions_of(self, experiment: Any, state: Any, inputs: list[str]) -> list[str]:
        """The text greedy decoding writes for each input."""
        data, longest = experiment.data, experiment.config.data.max_length
        rows = [np.append(ids[: longest - 1], np.int32(data.vocabulary.end_of_text))
                for ids in encode_counting_unknown(data.vocabulary, inputs, "the inputs")]
        ids = np.zeros((len(rows), longest), np.int32)
        for index, row in enumerate(rows):
            ids[index, : len(row)] = row
        target = experiment.config.task.options.get("max_target_length") or longest
        return written_texts(experiment, state, ids, np.asarray(list(map(len, rows))), target)

    def example_batch(self, data: TaskData | None) -> dict[str, np.ndarray]:
        return {"input_ids": np.zeros((2, 8), np.int32), "attention_mask": np.ones((2, 8), np.int32),
                "decoder_input_ids": np.zeros((2, 4), np.int32), "labels": np.zeros((2, 4), np.int32)}

    def head(self, family: Family | None, arch: Architecture | None, hf_config: Mapping[str, Any],
             data: Seq2SeqData) -> Head:
        """None beyond the model's own LM head."""
        return Head(modules={}, shapes={}, drawn=())

    def head_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        return 0.0

    def hf_class(self, family: Family, model_type: str) -> str:
        return family.hf_class


def written_texts(experiment: Any, state: Any, input_ids: np.ndarray, lengths: np.ndarray,
                  new_tokens: int) -> list[str]:
    """The texts greedy decoding writes for inputs [N, L] of `lengths` tokens, a global batch at a time (each cut
    to the bucket of its longest input), each ending at end-of-text."""
    data, batch = experiment.data, experiment.config.train.global_batch
    end = data.vocabulary.end_of_text
    texts = []
    for first in range(0, len(lengths), batch):
        rows = slice(first, first + batch)
        width = int(min(max(8, 1 << (int(lengths[rows].max()) - 1).bit_length()), input_ids.shape[1]))
        mask = (np.arange(width)[None, :] < lengths[rows, None]).astype(np.int32)
        count = len(mask)
        tokens = experiment.backend.generate(state, Prompts(input_ids[rows, :width] * mask, mask, new_tokens, 0.0, 0,
                                                            np.zeros((count, new_tokens), np.float32)))
        for row in tokens:
            kept = row[: np.flatnonzero(np.append(row == end, True))[0]]
            texts.append(data.vocabulary.tokenizer.decode([int(i) for i in kept], skip_special_tokens=True))
    return texts


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _tokenizer(folder: Path) -> tuple[CheckpointTokenizer, int, int]:
    """The checkpoint's tokenizer (which must end a text with </s>), its decoder's start and padding ids."""
    tokenizer = CheckpointTokenizer(folder)
    if tokenizer.end_of_text is None:
        raise DataError(f"the tokenizer in {folder} has no end-of-text token (</s>): give a T5 tokenizer "
                        "(tokenizer.json with </s>)")
    model = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    return tokenizer, model.get("decoder_start_token_id", 0), model.get("pad_token_id", 0)


def _cut_inputs(encoded: Mapping[str, tuple[list[np.ndarray], list[np.ndarray]]], max_length: int) -> int:
    """How many inputs of every split `encoded` (name -> (inputs, targets), each ending at end-of-text) data.max_length
    cuts, said in one line; refused when it cuts every training input to its end-of-text alone."""
    lengths = {name: np.asarray([len(ids) for ids in inputs]) for name, (inputs, _) in encoded.items()}
    train = lengths["train"]
    if train.max() > 1 and (np.minimum(train, max_length) <= 1).all():
        raise DataError(f"data.max_length = {max_length} cuts every training input to its end-of-text token alone, "
                        f"nothing left to read: raise it (the longest input is {train.max()} tokens with its "
                        "end-of-text)")
    cut = sum(int((found > max_length).sum()) for found in lengths.values())
    if cut:
        total = sum(len(found) for found in lengths.values())
        _say(f"{cut:,} of {total:,} inputs are longer than data.max_length = {max_length} tokens and are cut (their "
             f"end-of-text kept; the longest is {max(found.max() for found in lengths.values())} tokens): raise "
             "data.max_length to read them whole")
    return cut


def _say(line: str) -> None:
    """One line about the data on stderr, from the first process alone (each prepares the same data)."""
    if expected_process_index() == 0:
        print(f"tpuplex: {line}", file=sys.stderr, flush=True)


def _pairs(inputs: Sequence[np.ndarray], targets: Sequence[np.ndarray], max_length: int, target_length: int,
           eos: int) -> TextPairs:
    """Token rows as a `TextPairs` split: inputs cut to max_length (the last kept token made end-of-text), right-
    padded with 0; targets right-padded with IGNORED to target_length."""
    ids = np.zeros((len(inputs), max_length), np.int32)
    lengths = np.zeros(len(inputs), np.int32)
    labels = np.full((len(targets), target_length), IGNORED, np.int32)
    for row, (source, target) in enumerate(zip(inputs, targets, strict=True)):
        kept = source[:max_length].copy()
        kept[-1] = eos
        ids[row, :len(kept)], lengths[row] = kept, len(kept)
        labels[row, :len(target)] = target
    return TextPairs(ids, np.zeros_like(ids), lengths, labels)


TASK = Seq2Seq()

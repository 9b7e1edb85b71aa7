"""Your own data for sequence classification: a labelled table instead of a GLUE name.

    [task]
    name = "sequence_classification"
    text_columns = ["review"]             # one column, or two for sentence pairs
    label_column = "label"
    labels = ["neg", "pos"]               # class index = position; or regression = true for float labels
    metrics = ["accuracy", "f1"]          # default: accuracy, or pearson and spearman for regression

    [data]
    dataset = "reviews"                   # only a name here: cache files and runtime.output_dir's {dataset}
    train_file = "data/train.csv"         # formats: see tpuplex.data.tables
    eval_files = ["data/dev.csv"]         # split names = file stems ("dev"); each evaluated and scored
    test_file = "data/test.jsonl"         # optional; labels optional; checked and tokenized, never trained on

`dataset_sources(config.data, table)` is what the pipeline asks for: the task and the sources of its splits, your
own files when `data.train_file` is set and the GLUE task `data.dataset` otherwise. Your task is a `Dataset` as
GLUE's are (no GLUE folder, no hub columns), so batching, training and the metrics treat both alike.

Labels are matched as text: a string as written, any other value as its JSON text, so `labels = [0, 1]` (kept as
"0", "1") matches the CSV cell "0" and the JSON number 0 alike. A test file without the label column gets labels
-1 (classification) or NaN (regression).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from typing import Any

import numpy as np

from tpuplex.config import DataConfig
from tpuplex.data.tables import DataFile, Table, read_table, resolve_file
from tpuplex.errors import DataError
from tpuplex.metrics import CLASSIFICATION_METRICS, REGRESSION_METRICS
from tpuplex.tasks.base import check_split_names
from tpuplex.tasks.sequence_classification.glue.datasets import Dataset, get_dataset
from tpuplex.tasks.sequence_classification.glue.files import Examples
from tpuplex.tasks.sequence_classification.glue.sources import GlueData, Source

# The fields that describe your own data: set without train_file they would be silently ignored.
CUSTOM_FIELDS = ("eval_files", "test_file")
"""[data] fields that only your own data has."""


@dataclasses.dataclass(frozen=True)
class LabelledTable:
    """How your own table is read (sequence classification's `[task]` options)."""

    text_columns: tuple[str, ...] = ()
    """The one or two text columns (two: a sentence pair)."""
    label_column: str = "label"
    labels: tuple[str, ...] = ()
    """The label values (strings or integers); class index = position in this list."""
    regression: bool = False
    """Float labels and one output instead of labels."""
    metrics: tuple[str, ...] = ()
    """From accuracy, f1, mcc (classification), pearson, spearman (regression); empty: accuracy, or pearson and
    spearman."""
TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclasses.dataclass(frozen=True)
class CustomData:
    """Your own task and its files: `files` maps "train" and each evaluation split to its file; `test` is the
    optional test file."""

    dataset: Dataset
    files: dict[str, DataFile]
    test: DataFile | None

    def sources(self) -> dict[str, Source]:
        """The labelled splits, "train" first."""
        return {split: file_source(self.dataset, file, labelled=True) for split, file in self.files.items()}

    def test_source(self) -> Source | None:
        return None if self.test is None else file_source(self.dataset, self.test, labelled=False)

    def prediction_sources(self, split: str) -> dict[str, Source]:
        """The split `tpuplex predict --split split` writes: "test" (data.test_file) or an evaluation split."""
        if split == "test" and self.test is not None:
            return {"test": self.test_source()}
        if split in self.files and split != "train":
            return {split: file_source(self.dataset, self.files[split], labelled=True)}
        choices = [name for name in self.files if name != "train"] + (["test"] if self.test else [])
        raise DataError(f"your data has no split {split!r} to predict: use one of {', '.join(choices)} "
                        "(set data.test_file to predict on a file without labels)")


def dataset_sources(data: DataConfig, table: LabelledTable = LabelledTable()) -> GlueData | CustomData:
    """Your own task when `data.train_file` is set (read as `table` says), else the GLUE task `data.dataset`;
    checks every field and that every file exists, reading none of them."""
    if data.train_file:
        return custom_data(data, table)
    given = [f"data.{name}" for name in CUSTOM_FIELDS if getattr(data, name) != getattr(DataConfig(), name)]
    given += [f"task.{field.name}" for field in dataclasses.fields(table)
              if getattr(table, field.name) != field.default]
    if given:
        raise DataError(f"{given[0]} is set but data.train_file is empty: set data.train_file to train on your own "
                        f"data, or remove {given[0]} to use the GLUE task {data.dataset!r}")
    return GlueData(get_dataset(data.dataset), data.data_dir)


def custom_data(data: DataConfig, table: LabelledTable = LabelledTable()) -> CustomData:
    """Your own task from `data` (data.train_file set) read as `table` says, its fields checked before its files
    are looked up."""
    if not TASK_NAME.fullmatch(data.dataset):
        raise DataError(f"data.dataset = {data.dataset!r} cannot name your own task: use letters, digits, '.', '-' "
                        "and '_' (it names cache files and fills {task} in runtime.output_dir)")
    if data.data_dir:
        raise DataError(f"data.data_dir = {data.data_dir!r} (--data-dir) is for GLUE tasks, but data.train_file "
                        "is set: remove data.data_dir and give your files' paths in data.train_file and "
                        "data.eval_files")
    text_columns = _text_columns(table.text_columns)
    labels = _labels(table.labels, table.regression)
    metrics = _metrics(table.metrics, labels, table.regression)
    if not data.eval_files:
        raise DataError('data.eval_files is empty: give at least one labelled evaluation file, e.g. '
                        'eval_files = ["data/dev.csv"]')
    train = resolve_file("data.train_file", data.train_file)
    evaluation = _eval_files(data.eval_files)
    test = resolve_file("data.test_file", data.test_file) if data.test_file else None
    task = Dataset(data.dataset, folder="", labels=labels, metrics=metrics, text_columns=text_columns,
                label_column=table.label_column, hub_text_columns=(), eval_splits=tuple(evaluation))
    return CustomData(task, {"train": train, **evaluation}, test)


def _text_columns(columns: tuple[str, ...]) -> tuple[str, ...]:
    if not 1 <= len(columns) <= 2:
        raise DataError(f"task.text_columns = {list(columns)!r} must name one or two text columns: e.g. "
                        '["sentence"], or ["premise", "hypothesis"] for sentence pairs')
    if len(set(columns)) < len(columns):
        raise DataError(f"task.text_columns = {list(columns)!r} names one column twice: give two different "
                        "columns, or one")
    return columns


def _labels(labels: tuple[str, ...], regression: bool) -> tuple[str, ...]:
    """The class labels; empty for regression."""
    if regression and labels:
        raise DataError("task.labels and task.regression = true are both set: give labels for classification "
                        "or regression = true for number labels, not both")
    if regression:
        return ()
    if not labels:
        raise DataError("your own data needs task.labels (classification, e.g. labels = [0, 1] or "
                        '["neg", "pos"]) or task.regression = true (number labels)')
    if len(labels) < 2:
        raise DataError(f"task.labels = {list(labels)!r} has one label: a classifier needs at least two (or set "
                        "task.regression = true)")
    repeated = next((label for label in labels if labels.count(label) > 1), None)
    if repeated is not None:
        raise DataError(f"task.labels = {list(labels)!r} lists {repeated!r} twice: give each label once (the "
                        "class index is its position)")
    return labels


def _metrics(metrics: tuple[str, ...], labels: tuple[str, ...], regression: bool) -> tuple[str, ...]:
    allowed = REGRESSION_METRICS if regression else CLASSIFICATION_METRICS
    if not metrics:
        return REGRESSION_METRICS if regression else ("accuracy",)
    kind = "regression (task.regression = true)" if regression else "classification (task.labels)"
    for name in metrics:
        if name not in allowed:
            raise DataError(f"task.metrics: {name!r} is not a metric for {kind}: use {', '.join(allowed)}")
        if metrics.count(name) > 1:
            raise DataError(f"task.metrics lists {name!r} twice: give each metric once")
    if "f1" in metrics and len(labels) != 2:
        raise DataError(f"task.metrics: f1 scores the second label as the positive class, so it needs two labels "
                        f"and task.labels has {len(labels)}: use accuracy or mcc")
    return metrics


def _eval_files(specs: tuple[str, ...]) -> dict[str, DataFile]:
    """Evaluation split name -> file; names must be unique and differ from "train"."""
    files = [resolve_file(f"data.eval_files[{index}]", spec) for index, spec in enumerate(specs)]
    check_split_names(specs, [file.name for file in files])
    return {file.name: file for file in files}


def file_source(task: Dataset, file: DataFile, labelled: bool) -> Source:
    """The examples of `file`; the fingerprint covers its content and every setting that shapes the arrays."""
    settings = {"kind": file.kind, "text_columns": task.text_columns, "label_column": task.label_column,
                "labels": task.labels, "regression": task.is_regression, "labelled": labelled}
    settings_hash = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    return Source(f"file-sha256:{file.fingerprint()}:settings-sha256:{settings_hash}",
                  lambda: read_examples(task, file, labelled))


def read_examples(task: Dataset, file: DataFile, labelled: bool) -> Examples:
    """The examples of `file`: text columns checked row by row, labels parsed (when `labelled`, or when an
    unlabelled file has the label column anyway)."""
    label = [task.label_column]
    table = read_table(file, [*task.text_columns, *label] if labelled else task.text_columns,
                       optional=() if labelled else label)
    texts = [_texts(table, column) for column in task.text_columns]
    if task.label_column in table.columns:
        labels = _label_indices(table, task) if not task.is_regression else _scores(table, task.label_column)
    else:
        labels = np.full(len(table), np.nan, np.float32) if task.is_regression else np.full(len(table), -1, np.int32)
    return Examples(texts[0], texts[1] if task.is_pair else None, labels)


def _texts(table: Table, column: str) -> list[str]:
    values = table.columns[column]
    for row, value in enumerate(values):
        if value is None or isinstance(value, str) and not value.strip():
            raise DataError(f"{table.where(row)}: text column {column!r} is empty: fill in the text or drop "
                            "the row")
        if not isinstance(value, str):
            raise DataError(f"{table.where(row)}: text column {column!r} holds {value!r}, not text: text "
                            "columns must hold strings")
    return values


def label_text(value: Any) -> str:
    """How a label value is matched against task.labels: a string as it is, anything else as JSON (0 -> "0")."""
    return value if isinstance(value, str) else json.dumps(value)


def _label_indices(table: Table, task: Dataset) -> np.ndarray:
    """int32 [N]: each row's position in task.labels."""
    index = {label: position for position, label in enumerate(task.labels)}
    values = table.columns[task.label_column]
    indices = np.empty(len(values), np.int32)
    for row, value in enumerate(values):
        position = index.get(label_text(value))
        if position is None:
            raise DataError(f"{table.where(row)}: label {value!r} is not one of task.labels "
                            f"({', '.join(task.labels)}): add it to task.labels or correct the row")
        indices[row] = position
    return indices


def _scores(table: Table, column: str) -> np.ndarray:
    """float32 [N]: each row's label as a finite number."""
    values = table.columns[column]
    scores = np.empty(len(values), np.float32)
    for row, value in enumerate(values):
        score = _number(value)
        if not math.isfinite(score):
            raise DataError(f"{table.where(row)}: label {value!r} is not a number: with task.regression = true "
                            f"the {column!r} column must hold a finite number in every row")
        scores[row] = score
    return scores


def _number(value: Any) -> float:
    """`value` as a float (numbers, and text such as "3.5"); NaN for anything else, booleans included."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return math.nan
    try:
        return float(value)
    except (ValueError, OverflowError):
        return math.nan

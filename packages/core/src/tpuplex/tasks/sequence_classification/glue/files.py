"""Reading the original GLUE distribution files: `<folder>/<split>.tsv`, tab separated, no quoting.

Quoting is disabled because GLUE text contains unbalanced double quotes (`" The foodservice pie ...`) that a
quoting reader would swallow across lines. Files are decoded as UTF-8 with an optional byte-order mark (MRPC's
headers start with one). Every row must have exactly as many fields as the header: with quoting off, a missing or
extra tab is the only sign of a damaged row, and reading on would silently shift text into the wrong column.
Blank lines carry no example and are skipped.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from pathlib import Path

import numpy as np

from tpuplex.errors import DataError, absence
from tpuplex.tasks.sequence_classification.glue.datasets import Dataset
from tpuplex.text_files import csv_reader, read_utf8


@dataclasses.dataclass(frozen=True)
class Examples:
    """A labelled split as text.

    text_a: N first texts; text_b: N second texts, or None for single-sentence tasks;
    labels: int32 [N] class indices into `task.labels`, or float32 [N] scores for regression (stsb).
    """

    text_a: list[str]
    text_b: list[str] | None
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.text_a)


def check_split(task: Dataset, split: str) -> None:
    """Raise a TpuplexError naming the task's splits when `split` is not one of them (nor a test split)."""
    if split not in (*task.splits, *task.test_splits):
        raise DataError(f"GLUE task {task.name} has no split {split!r}: use one of "
                        f"{', '.join((*task.splits, *task.test_splits))}")


def split_file(task: Dataset, split: str, data_dir: str | Path) -> Path:
    """The existing TSV file of `split` in the task folder `data_dir`; a TpuplexError names what is missing."""
    check_split(task, split)
    folder = Path(data_dir)
    files = ", ".join(f"{name}.tsv" for name in task.splits)
    if not folder.is_dir():
        raise DataError(f"GLUE data folder {folder} {absence(folder)}: give the folder holding {task.folder}'s {files}")
    path = folder / f"{split}.tsv"
    if not path.is_file():
        raise DataError(f"GLUE file {path} {absence(path)}: the {task.folder} folder must hold {files} "
                        "(the original GLUE distribution)")
    return path


def read_split(task: Dataset, split: str, data_dir: str | Path) -> Examples:
    """Read `split` ("train", "dev", MNLI's "dev_matched"/"dev_mismatched", or a test split) from the task folder
    `data_dir`. Test files carry no labels: their examples get label -1 (0.0 for regression), in file order.

    Raises a TpuplexError naming the file (and line) for a missing folder or file, a missing header column, a row
    with the wrong number of fields, a label outside `task.labels` (or a score that is not a number), or no rows.
    """
    path = split_file(task, split, data_dir)
    with io.StringIO(read_utf8(path), newline="") as handle:
        rows = csv_reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = task.headerless_columns or tuple(next(rows, ()))
        if not header:
            raise _empty(task, path)
        text_index = [_column(header, name, path) for name in task.text_columns]
        labelled = split in task.splits
        label_index = _column(header, task.label_column, path) if labelled else 0
        texts: list[list[str]] = [[] for _ in text_index]
        raw_labels: list[str] = []
        label_lines: list[int] = []
        for row in rows:
            line = rows.line_num
            if not row:
                continue
            if len(row) != len(header):
                raise DataError(f"{path} line {line} has {len(row)} tab-separated fields, expected "
                                f"{len(header)} ({', '.join(header)}): repair the row or restore the original file")
            for column, index in zip(texts, text_index, strict=True):
                column.append(row[index])
            raw_labels.append(row[label_index])
            label_lines.append(line)
    if not raw_labels:
        raise _empty(task, path)
    if labelled:
        labels = _parse_labels(task, raw_labels, label_lines, path)
    else:
        labels = np.full(len(raw_labels), 0.0 if task.is_regression else -1,
                         np.float32 if task.is_regression else np.int32)
    return Examples(texts[0], texts[1] if task.is_pair else None, labels)


def _empty(task: Dataset, path: Path) -> DataError:
    return DataError(f"{path} holds no examples: restore the original GLUE {task.folder} file")


def _column(header: tuple[str, ...], name: str, path: Path) -> int:
    if name not in header:
        raise DataError(f"{path} has no column {name!r} (its header is {', '.join(header)}): "
                        "give the original GLUE file for this task")
    return header.index(name)


def _parse_labels(task: Dataset, raw: list[str], lines: list[int], path: Path) -> np.ndarray:
    """int32 [N] class indices, or float32 [N] finite scores for regression."""
    if task.is_regression:
        scores = np.empty(len(raw), dtype=np.float32)
        for position, (value, line) in enumerate(zip(raw, lines, strict=True)):
            try:
                score = float(value)
            except ValueError:
                score = math.nan
            if not math.isfinite(score):
                raise DataError(f"{path} line {line}: score {value!r} is not a finite number: "
                                f"the {task.label_column!r} column of {task.folder} must hold numbers")
            scores[position] = score
        return scores
    index = {label: i for i, label in enumerate(task.labels)}
    labels = np.empty(len(raw), dtype=np.int32)
    for position, (value, line) in enumerate(zip(raw, lines, strict=True)):
        if value not in index:
            raise DataError(f"{path} line {line}: label {value!r} is not a {task.name} label: "
                            f"allowed labels are {', '.join(task.labels)}")
        labels[position] = index[value]
    return labels

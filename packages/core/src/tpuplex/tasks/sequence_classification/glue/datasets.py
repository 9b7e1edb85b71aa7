"""The nine GLUE tasks: labels, official metrics, splits, and where their text and labels live.

Column names are those of the original GLUE distribution TSVs (CoLA's files have no header row, so its column
names are given here) and of the HF `nyu-mll/glue` dataset. Label strings appear in the order of the HF dataset's
class labels, so class index i means the same thing whichever source the data came from.
"""

from __future__ import annotations

import dataclasses

from tpuplex.errors import DataError


@dataclasses.dataclass(frozen=True)
class Dataset:
    """One GLUE task, or your own (`tpuplex.tasks.sequence_classification.custom`: folder empty, no hub columns,
    eval splits named after its files).

    name: canonical lowercase name, also the HF dataset config ("sst2").
    folder: the folder of the GLUE distribution ("SST-2").
    labels: label strings as written in the TSV files, index = class id; empty for regression (stsb).
    metrics: the official metrics, keys of `tpuplex.metrics.compute`.
    eval_splits: the labelled evaluation splits; a split named s is read from `<folder>/<s>.tsv`.
    text_columns: TSV header names of the one or two text columns.
    label_column: TSV header name of the label (or score) column.
    headerless_columns: column names of files that have no header row (CoLA); None when the first row is one.
    hub_text_columns: the text columns of the HF dataset (its label column is always "label").
    """

    name: str
    folder: str
    labels: tuple[str, ...]
    metrics: tuple[str, ...]
    text_columns: tuple[str, ...]
    label_column: str
    hub_text_columns: tuple[str, ...]
    eval_splits: tuple[str, ...] = ("dev",)
    headerless_columns: tuple[str, ...] | None = None

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        """Outputs of the classifier: the number of classes, or 1 for regression."""
        return 1 if self.is_regression else len(self.labels)

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2

    @property
    def splits(self) -> tuple[str, ...]:
        """Every labelled split: "train" and the evaluation splits."""
        return ("train", *self.eval_splits)

    @property
    def test_splits(self) -> tuple[str, ...]:
        """The unlabelled test files of the GLUE distribution: "test", MNLI's "test_matched" and "test_mismatched"."""
        return tuple(split.replace("dev", "test") for split in self.eval_splits)

    def submission_file(self, test_split: str) -> str:
        """The file name the GLUE server expects for the predictions of `test_split` ("MNLI-m.tsv", "RTE.tsv")."""
        suffix = {"test_matched": "-m", "test_mismatched": "-mm"}.get(test_split, "")
        return f"{self.folder}{suffix}.tsv"


_BINARY = ("0", "1")
_ENTAILMENT = ("entailment", "not_entailment")
_PAIR = ("sentence1", "sentence2")

DATASETS: dict[str, Dataset] = {
    task.name: task
    for task in (
        Dataset("cola", "CoLA", _BINARY, ("mcc",), ("sentence",), "label", ("sentence",),
             headerless_columns=("source", "label", "original_label", "sentence")),
        Dataset("sst2", "SST-2", _BINARY, ("accuracy",), ("sentence",), "label", ("sentence",)),
        Dataset("mrpc", "MRPC", _BINARY, ("accuracy", "f1"), ("#1 String", "#2 String"), "Quality", _PAIR),
        Dataset("stsb", "STS-B", (), ("pearson", "spearman"), _PAIR, "score", _PAIR),
        Dataset("qqp", "QQP", _BINARY, ("accuracy", "f1"), ("question1", "question2"), "is_duplicate",
             ("question1", "question2")),
        Dataset("mnli", "MNLI", ("entailment", "neutral", "contradiction"), ("accuracy",), _PAIR, "gold_label",
             ("premise", "hypothesis"), eval_splits=("dev_matched", "dev_mismatched")),
        Dataset("qnli", "QNLI", _ENTAILMENT, ("accuracy",), ("question", "sentence"), "label",
                ("question", "sentence")),
        Dataset("rte", "RTE", _ENTAILMENT, ("accuracy",), _PAIR, "label", _PAIR),
        Dataset("wnli", "WNLI", _BINARY, ("accuracy",), _PAIR, "label", _PAIR),
    )
}


def get_dataset(name: str) -> Dataset:
    """The task called `name`, in any case and with or without its dash ("SST-2", "sst-2", "sst2", "STS-B")."""
    key = name.strip().lower().replace("-", "").replace("_", "")
    if key not in DATASETS:
        raise DataError(f"unknown GLUE dataset {name!r}: use one of {', '.join(DATASETS)}")
    return DATASETS[key]

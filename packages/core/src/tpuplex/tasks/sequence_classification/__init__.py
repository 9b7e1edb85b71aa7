"""Sequence classification (`AutoModelForSequenceClassification`): one label (or score) per text or text pair.

Data: a GLUE dataset (`data.dataset = "mrpc"`, the catalogue in `glue/`) or your own table (`data.train_file`,
`custom.py`), tokenized once through the cache (`features.py`). Batches are the Batcher's rows as they are: labels
int32 [B] (float32 for regression) and weight [B]. Loss: cross-entropy, or squared error when the dataset is a
regression (one output). Metrics: the dataset's official ones, its leaderboard `score` and the mean `loss`.
Predictions: one TSV per split (GLUE's submission files for GLUE test splits).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex import tasks
from tpuplex.data.batching import Encoded
from tpuplex.data.tokenize import load_tokenizer
from tpuplex.errors import DataError
from tpuplex.metrics import compute, cross_entropy
from tpuplex.models import Architecture, Family
from tpuplex.tasks.base import (
    Task,
    TaskData,
    check_inputs,
    framework_modules,
    matmul_weights,
    probabilities,
    scored_label,
)
from tpuplex.tasks.sequence_classification.custom import CustomData, LabelledTable, dataset_sources
from tpuplex.tasks.sequence_classification.features import encode, encode_cached
from tpuplex.tasks.sequence_classification.glue import Dataset, GlueData, Source
from tpuplex.tasks.sequence_classification.glue.files import Examples
from tpuplex.tasks.sequence_classification.heads import FAMILY_HEADS, ClassifierHead, classifier_head
from tpuplex.text_files import staged_text

Options = LabelledTable
"""How your own table is read (text_columns, label_column, labels or regression, metrics); a GLUE dataset says
all of it itself."""


@dataclasses.dataclass
class ClassificationData(TaskData):
    name: str
    train: Encoded
    eval: dict[str, Encoded]
    dataset: Dataset
    sources: GlueData | CustomData
    test: Encoded | None = None

    @property
    def num_labels(self) -> int:
        return self.dataset.num_labels

    def metrics(self, split: str, outputs: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> dict[str, float]:
        return {**compute(self.dataset, outputs, labels), "loss": mean_loss(outputs, labels)}


class SequenceClassification(Task):
    name: ClassVar[str] = "sequence_classification"
    Options: ClassVar[type] = Options
    backends: ClassVar[Mapping[str, str]] = framework_modules(__name__)
    model_kinds: ClassVar[tuple[str, ...]] = ("text", "own")
    auto_class: ClassVar[str] = "AutoModelForSequenceClassification"

    def check(self, config: Any, options: Options) -> None:
        dataset_sources(config.data, options)

    def metric_names(self, config: Any, options: Options) -> dict[str, tuple[str, ...]]:
        """The dataset's official metrics, its `score` and `loss`, on each of its evaluation splits."""
        dataset = dataset_sources(config.data, options).dataset
        return dict.fromkeys(dataset.eval_splits, (*dataset.metrics, "score", "loss"))

    def prepare(self, config: Any, options: Options, tokenizer_dir: Path) -> ClassificationData:
        sources = dataset_sources(config.data, options)
        dataset = sources.dataset

        def encode(split: str, source: Source) -> Encoded:
            return encode_cached(dataset, split, source, tokenizer_dir, config.data.max_length,
                                 Path(config.data.cache_dir).expanduser())

        labelled = {split: encode(split, source) for split, source in sources.sources().items()}
        test_source = sources.test_source()
        return ClassificationData(dataset.name, labelled.pop("train"), labelled, dataset, sources,
                                  None if test_source is None else encode("test", test_source))

    def head(self, family: Family, arch: Architecture, hf_config: Mapping[str, Any],
             data: ClassificationData) -> ClassifierHead:
        return classifier_head(family, arch, hf_config, data.num_labels)

    def head_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        """The dense layer and the classifier, once per row."""
        return 2.0 * len(batch["input_ids"]) * matmul_weights(spec.head.shapes)

    def hf_class(self, family: Family, model_type: str) -> str:
        return FAMILY_HEADS[family.name].hf_classes[family.model_types.index(model_type)]

    def export_config(self, config: Any) -> dict[str, Any]:
        dataset = dataset_sources(config.data, _options(self, config)).dataset
        labels = dataset.labels or ("score",)
        return {"id2label": dict(enumerate(labels)), "label2id": {label: i for i, label in enumerate(labels)},
                "problem_type": "regression" if dataset.is_regression else "single_label_classification"}

    def prediction_sources(self, config: Any, split: str) -> dict[str, Source]:
        """The splits `tpuplex predict --split split` writes, checked before any backend starts."""
        return dataset_sources(config.data, _options(self, config)).prediction_sources(split)

    def write_predictions(self, experiment: Any, state: Any, sources: dict[str, Source], out: Path,
                          write: bool) -> dict[str, Path]:
        data, trainer, config = experiment.data, experiment.trainer, experiment.config
        dataset, written = data.dataset, {}
        for name, source in sources.items():
            encoded = encode_cached(dataset, name, source, experiment.model_dir, config.data.max_length,
                                    Path(config.data.cache_dir).expanduser())
            logits, _ = trainer.predict(state, trainer.batcher(encoded))
            in_glue = name in dataset.test_splits and dataset.folder
            if write:
                path = out / (dataset.submission_file(name) if in_glue else f"{name}.tsv")
                written[name] = _write_tsv(path, predictions(dataset, logits))
        return written

    def prediction_inputs(self, config: Any, inputs: Sequence[Any]) -> Examples:
        """Texts (str), or pairs of texts ((str, str)) for a task of two text columns (MRPC's two sentences)."""
        dataset = dataset_sources(config.data, _options(self, config)).dataset
        if len(dataset.text_columns) == 2:
            wanted = f"pairs of texts ({' and '.join(dataset.text_columns)} of {dataset.name}): (str, str) tuples"
            pairs = check_inputs(inputs, tuple | list, wanted)
            for index, pair in enumerate(pairs):
                if len(pair) != 2 or not all(isinstance(text, str) for text in pair):
                    raise DataError(f"inputs[{index}] = {pair!r}: give {wanted}")
            first, second = [a for a, _ in pairs], [b for _, b in pairs]
        else:
            first, second = check_inputs(inputs, str, f"texts to classify ({dataset.name}): strings"), None
        return Examples(first, second, np.zeros(len(first), np.float32 if dataset.is_regression else np.int32))

    def predictions_of(self, experiment: Any, state: Any, inputs: Examples) -> list[str | float]:
        """Each input's label (or, for a regression task, its score)."""
        logits = _logits_of(experiment, state, inputs)
        if experiment.data.dataset.is_regression:
            return [float(score) for score in logits[:, 0]]
        return predictions(experiment.data.dataset, logits)

    def scored_predictions_of(self, experiment: Any, state: Any, inputs: Examples) -> list[dict[str, Any]]:
        """Each input's `label`, `score` (its probability) and `scores` (every label's: the softmax of the logits);
        a regression task's `label` and `score` are both the predicted value."""
        logits, dataset = _logits_of(experiment, state, inputs), experiment.data.dataset
        if dataset.is_regression:
            return [{"label": float(value), "score": float(value)} for value in logits[:, 0]]
        return [scored_label(row, dataset.labels) for row in probabilities(logits)]


def _logits_of(experiment: Any, state: Any, inputs: Examples) -> np.ndarray:
    """The logits [N, labels] of texts given in memory, tokenized as the run's data."""
    max_length, trainer = experiment.config.data.max_length, experiment.trainer
    encoded = encode(inputs, load_tokenizer(experiment.model_dir, max_length), max_length)
    return trainer.predict(state, trainer.batcher(encoded))[0]


def _options(task: Task, config: Any) -> Options:
    return tasks.options(task, config.task.options)


def mean_loss(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean cross-entropy of logits [N, C] against class labels [N], or mean squared error when C == 1."""
    if logits.shape[1] == 1:
        return float(np.mean((logits[:, 0].astype(np.float64) - labels) ** 2))
    return float(np.mean(cross_entropy(logits, labels)))


def predictions(dataset: Dataset, logits: np.ndarray) -> list[str]:
    """One prediction per example, as the GLUE server reads them: the label string of the argmax class, or the
    regression score with three decimals."""
    if dataset.is_regression:
        return [f"{score:.3f}" for score in logits[:, 0]]
    return [dataset.labels[index] for index in logits.argmax(axis=1)]


def _write_tsv(path: Path, values: list[str]) -> Path:
    with staged_text(path) as staging:
        staging.write("index\tprediction\n")
        staging.writelines(f"{index}\t{value}\n" for index, value in enumerate(values))
    return path


TASK = SequenceClassification()

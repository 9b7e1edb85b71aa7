"""The official GLUE metrics in numpy, matching scikit-learn and scipy (to rounding) including their edge cases.

Every function takes 1-D arrays of equal length N >= 1 and returns a Python float, computed in float64.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from tpuplex.errors import TpuplexError


class Scored(Protocol):
    """What `compute` needs of a dataset (`tpuplex.tasks.sequence_classification.glue.Dataset`, or your own)."""

    name: str
    metrics: tuple[str, ...]

    @property
    def num_labels(self) -> int: ...

    @property
    def is_regression(self) -> bool: ...


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Fraction of predictions equal to the labels."""
    return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def f1(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Binary F1 of the positive class 1: 2 tp / (2 tp + fp + fn).

    With no positive label and no positive prediction the ratio is 0/0; like scikit-learn's default
    (zero_division="warn"), that returns 0.0.
    """
    labels, predictions = np.asarray(labels) == 1, np.asarray(predictions) == 1
    true_positive = np.sum(labels & predictions)
    denominator = 2 * true_positive + np.sum(labels != predictions)
    return float(2 * true_positive / denominator) if denominator else 0.0


def matthews_corrcoef(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Matthews correlation coefficient, multiclass form (Gorodkin 2004) as in scikit-learn.

    With C the confusion matrix over the classes present, t/p its row/column sums, c its trace and s its total:
    (c s - t.p) / sqrt((s^2 - p.p) (s^2 - t.t)). When either factor under the root is 0 (all labels, or all
    predictions, one class) the coefficient is undefined and, as in scikit-learn, 0.0 is returned.
    """
    classes, inverse = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    n = len(labels)
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(confusion, (inverse[:n], inverse[n:]), 1.0)
    true_sum, predicted_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    samples = float(n)
    covariance = np.trace(confusion) * samples - true_sum @ predicted_sum
    predicted_variance = samples**2 - predicted_sum @ predicted_sum
    true_variance = samples**2 - true_sum @ true_sum
    if predicted_variance * true_variance == 0:
        return 0.0
    return float(covariance / np.sqrt(true_variance * predicted_variance))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation. NaN when either input is constant or N < 2, as scipy.stats.pearsonr returns NaN for
    constant input (scipy raises for N < 2; undefined either way)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    x_unit, y_unit = (_unit(values - values.mean()) for values in (x, y))
    r = x_unit @ y_unit
    return float(np.clip(r, -1.0, 1.0))


def _unit(centred: np.ndarray) -> np.ndarray:
    """`centred` / its norm, scaled by its largest magnitude first so tiny or huge values neither underflow nor
    overflow when squared (as scipy does)."""
    centred = centred / np.abs(centred).max()
    return centred / np.linalg.norm(centred)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation: Pearson of the ranks, tied values sharing their average rank.
    NaN when either input is constant or N < 2 (as scipy.stats.spearmanr)."""
    return pearson(average_ranks(x), average_ranks(y))


def average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..N of `values` [N], ties given the mean of the ranks they span (scipy.stats.rankdata "average")."""
    values = np.asarray(values)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    # Each run of equal values spans ranks first+1 .. last+1; every member gets their mean.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    run_ranks = (starts + 1 + ends) / 2.0
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.repeat(run_ranks, ends - starts)
    return ranks


_METRICS = {"accuracy": accuracy, "f1": f1, "mcc": matthews_corrcoef, "pearson": pearson, "spearman": spearman}
CLASSIFICATION_METRICS = ("accuracy", "f1", "mcc")
"""Metrics of class predictions (f1 only for two classes: it scores class 1)."""
REGRESSION_METRICS = ("pearson", "spearman")
"""Metrics of predicted scores."""


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Cross-entropy of each row of logits [..., C] against int labels [...], in float64: shape [...]."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_probs, labels[..., None].astype(np.int64), axis=-1)[..., 0]


def compute(task: Scored, logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The task's official metrics and its GLUE leaderboard `score`.

    logits: [N, task.num_labels] (class logits; the prediction is the argmax), or [N, 1] predicted scores for
    regression; labels: [N] class indices, or scores. `score` is the mean of the task's metrics (MRPC and QQP:
    accuracy and F1; STS-B: Pearson and Spearman), the single metric otherwise.
    """
    logits, labels = np.asarray(logits), np.asarray(labels)
    if logits.ndim != 2 or logits.shape[1] != task.num_labels or labels.shape != logits.shape[:1]:
        raise TpuplexError(f"{task.name} metrics need logits [N, {task.num_labels}] and labels [N], got "
                           f"{list(logits.shape)} and {list(labels.shape)}: pass one row of logits per example")
    if not len(labels):
        raise TpuplexError(f"{task.name} metrics need at least one example, got none: check the evaluation split")
    predictions = logits[:, 0] if task.is_regression else np.argmax(logits, axis=1)
    results = {name: _METRICS[name](labels, predictions) for name in task.metrics}
    results["score"] = float(np.mean([results[name] for name in task.metrics]))
    return results

"""GLUE metrics in numpy, checked against scikit-learn and scipy on random inputs, ties and degenerate cases."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tpuplex import TpuplexError
from tpuplex.metrics import accuracy, average_ranks, compute, f1, matthews_corrcoef, pearson, spearman
from tpuplex.tasks.sequence_classification.glue import get_dataset

TOLERANCE = 1e-9
# The same examples on every run, no example database, no time limit on a busy machine.
DETERMINISTIC = settings(derandomize=True, database=None, deadline=None)


@st.composite
def label_pairs(draw, classes: int, min_size: int = 1):
    """Two equally long int arrays with values in [0, classes): few classes make ties and one-class cases common."""
    size = draw(st.integers(min_size, 40))
    values = st.integers(0, classes - 1)
    return (draw(arrays(np.int64, size, elements=values)), draw(arrays(np.int64, size, elements=values)))


@st.composite
def score_pairs(draw):
    """Two float arrays of N >= 2; values from a small grid (many ties, sometimes constant) or continuous."""
    size = draw(st.integers(2, 40))
    grid = st.sampled_from([0.0, 0.5, 1.0, 2.5, 5.0])
    continuous = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
    elements = draw(st.sampled_from([grid, continuous]))
    return draw(arrays(np.float64, size, elements=elements)), draw(arrays(np.float64, size, elements=elements))


def assert_same(ours: float, reference: float) -> None:
    if math.isnan(reference):
        assert math.isnan(ours)
    else:
        assert abs(ours - reference) <= TOLERANCE


def sklearn_quietly(metric, *args, **kwargs) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns on the 0/0 cases whose returned value we compare
        return float(metric(*args, **kwargs))


def scipy_quietly(statistic, x, y) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on constant input and returns NaN
        return float(statistic(x, y).statistic)


@DETERMINISTIC
@given(label_pairs(classes=3))
def test_accuracy_matches_sklearn(pair):
    assert_same(accuracy(*pair), sklearn.metrics.accuracy_score(*pair))


@DETERMINISTIC
@given(label_pairs(classes=2))
def test_f1_matches_sklearn_including_no_positives(pair):
    assert_same(f1(*pair), sklearn_quietly(sklearn.metrics.f1_score, *pair, pos_label=1, average="binary"))


@DETERMINISTIC
@given(label_pairs(classes=2))
def test_binary_mcc_matches_sklearn(pair):
    assert_same(matthews_corrcoef(*pair), sklearn_quietly(sklearn.metrics.matthews_corrcoef, *pair))


@DETERMINISTIC
@given(label_pairs(classes=4))
def test_multiclass_mcc_matches_sklearn(pair):
    assert_same(matthews_corrcoef(*pair), sklearn_quietly(sklearn.metrics.matthews_corrcoef, *pair))


@DETERMINISTIC
@given(score_pairs())
@example((np.array([0.0, 1.0, 1.0]), np.array([0.0, 3.5e-188, 0.0])))  # squares underflow without rescaling
def test_pearson_matches_scipy(pair):
    assert_same(pearson(*pair), scipy_quietly(scipy.stats.pearsonr, *pair))


@DETERMINISTIC
@given(score_pairs())
def test_spearman_matches_scipy(pair):
    assert_same(spearman(*pair), scipy_quietly(scipy.stats.spearmanr, *pair))


@DETERMINISTIC
@given(arrays(np.float64, st.integers(1, 40), elements=st.sampled_from([0.0, 1.0, 2.0, 3.5])))
def test_average_ranks_match_scipy_rankdata(values):
    np.testing.assert_array_equal(average_ranks(values), scipy.stats.rankdata(values, method="average"))


def test_degenerate_cases_follow_sklearn_and_scipy():
    ones, zeros = np.ones(4, dtype=int), np.zeros(4, dtype=int)
    assert f1(zeros, zeros) == 0.0  # no positives anywhere: 0/0 -> 0.0
    assert f1(ones, ones) == 1.0
    assert matthews_corrcoef(ones, ones) == 0.0  # one class only: 0/0 -> 0.0
    assert matthews_corrcoef(np.array([0, 1, 0, 1]), zeros) == 0.0
    assert math.isnan(pearson(np.full(4, 2.5), np.arange(4.0)))
    assert math.isnan(spearman(np.arange(4.0), np.full(4, 0.1)))
    assert math.isnan(pearson(np.array([1.0]), np.array([2.0])))


def test_pearson_detects_constant_input_that_does_not_average_exactly():
    # mean([0.1] * 3) != 0.1 in floating point; the input is still constant, so the result is NaN, not noise.
    values = np.full(3, 0.1)
    assert values.mean() != 0.1
    assert math.isnan(pearson(values, np.array([1.0, 2.0, 4.0])))


# --- compute -------------------------------------------------------------------------------------------------------


def random_case(num_labels: int, size: int = 50, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((size, num_labels))
    labels = rng.uniform(0, 5, size) if num_labels == 1 else rng.integers(0, num_labels, size)
    return logits, labels


@pytest.mark.parametrize("name", ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"])
def test_compute_returns_the_official_metrics_and_score(name):
    task = get_dataset(name)
    logits, labels = random_case(task.num_labels)
    results = compute(task, logits, labels)
    assert set(results) == {*task.metrics, "score"}
    assert all(isinstance(value, float) for value in results.values())
    assert results["score"] == pytest.approx(np.mean([results[metric] for metric in task.metrics]), abs=0)


def test_compute_classification_uses_the_argmax():
    logits, labels = random_case(2, seed=1)
    predictions = logits.argmax(axis=1)
    results = compute(get_dataset("mrpc"), logits, labels)
    assert_same(results["accuracy"], sklearn.metrics.accuracy_score(labels, predictions))
    assert_same(results["f1"], sklearn.metrics.f1_score(labels, predictions))
    assert results["score"] == (results["accuracy"] + results["f1"]) / 2
    assert_same(compute(get_dataset("cola"), logits, labels)["mcc"],
                sklearn.metrics.matthews_corrcoef(labels, predictions))


def test_compute_regression_reads_the_single_output_column():
    logits, labels = random_case(1, seed=2)
    results = compute(get_dataset("stsb"), logits, labels)
    assert_same(results["pearson"], scipy.stats.pearsonr(logits[:, 0], labels).statistic)
    assert_same(results["spearman"], scipy.stats.spearmanr(logits[:, 0], labels).statistic)
    assert results["score"] == (results["pearson"] + results["spearman"]) / 2


@pytest.mark.parametrize(("logits_shape", "labels_shape"), [((5, 3), (5,)), ((5,), (5,)), ((5, 2), (4,))])
def test_compute_rejects_mismatched_shapes(logits_shape, labels_shape):
    with pytest.raises(TpuplexError, match=r"rte metrics need logits \[N, 2\] and labels \[N\]"):
        compute(get_dataset("rte"), np.zeros(logits_shape), np.zeros(labels_shape, dtype=int))


def test_compute_rejects_no_examples():
    with pytest.raises(TpuplexError, match="at least one example"):
        compute(get_dataset("rte"), np.zeros((0, 2)), np.zeros(0, dtype=int))

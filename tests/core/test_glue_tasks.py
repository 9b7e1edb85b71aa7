"""The GLUE task table and task-name lookup."""

from __future__ import annotations

import pytest

from tpuplex import TpuplexError
from tpuplex.tasks.sequence_classification.glue import DATASETS, get_dataset


def test_all_nine_tasks_with_their_distribution_folders():
    assert {name: task.folder for name, task in DATASETS.items()} == {
        "cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
        "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI",
    }
    assert all(task.name == name for name, task in DATASETS.items())


def test_official_metrics():
    assert {name: task.metrics for name, task in DATASETS.items()} == {
        "cola": ("mcc",), "sst2": ("accuracy",), "mrpc": ("accuracy", "f1"), "stsb": ("pearson", "spearman"),
        "qqp": ("accuracy", "f1"), "mnli": ("accuracy",), "qnli": ("accuracy",), "rte": ("accuracy",),
        "wnli": ("accuracy",),
    }


def test_labels_follow_the_hf_dataset_class_order():
    # HF nyu-mll/glue: mnli 0 entailment, 1 neutral, 2 contradiction; qnli/rte 0 entailment, 1 not_entailment;
    # the binary tasks' files write the class id itself.
    assert get_dataset("mnli").labels == ("entailment", "neutral", "contradiction")
    assert get_dataset("qnli").labels == get_dataset("rte").labels == ("entailment", "not_entailment")
    for name in ("cola", "sst2", "mrpc", "qqp", "wnli"):
        assert get_dataset(name).labels == ("0", "1")


def test_num_labels_and_regression():
    stsb = get_dataset("stsb")
    assert stsb.is_regression and stsb.num_labels == 1 and stsb.labels == ()
    assert get_dataset("mnli").num_labels == 3
    assert all(task.num_labels == len(task.labels) for task in DATASETS.values() if not task.is_regression)


def test_splits():
    assert get_dataset("mnli").eval_splits == ("dev_matched", "dev_mismatched")
    assert get_dataset("mnli").splits == ("train", "dev_matched", "dev_mismatched")
    assert all(task.eval_splits == ("dev",) for task in DATASETS.values() if task.name != "mnli")


def test_pair_tasks():
    assert {name for name, task in DATASETS.items() if not task.is_pair} == {"cola", "sst2"}
    assert all(len(task.hub_text_columns) == len(task.text_columns) for task in DATASETS.values())


@pytest.mark.parametrize(
    ("given", "name"),
    [("SST-2", "sst2"), ("sst-2", "sst2"), ("sst2", "sst2"), ("STS-B", "stsb"), ("MNLI", "mnli"), ("CoLA", "cola"),
     (" rte ", "rte")],
)
def test_get_task_accepts_case_and_dash_variants(given, name):
    assert get_dataset(given) is DATASETS[name]


def test_unknown_task_lists_the_valid_ones():
    with pytest.raises(TpuplexError, match="unknown GLUE dataset 'squad'") as error:
        get_dataset("squad")
    assert all(name in str(error.value) for name in DATASETS)

"""The GLUE task table and task-name lookup."""

from __future__ import annotations

import pytest

from tpuplex import TpuplexError
from tpuplex.glue import TASKS, get_task


def test_all_nine_tasks_with_their_distribution_folders():
    assert {name: task.folder for name, task in TASKS.items()} == {
        "cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
        "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI",
    }
    assert all(task.name == name for name, task in TASKS.items())


def test_official_metrics():
    assert {name: task.metrics for name, task in TASKS.items()} == {
        "cola": ("mcc",), "sst2": ("accuracy",), "mrpc": ("accuracy", "f1"), "stsb": ("pearson", "spearman"),
        "qqp": ("accuracy", "f1"), "mnli": ("accuracy",), "qnli": ("accuracy",), "rte": ("accuracy",),
        "wnli": ("accuracy",),
    }


def test_labels_follow_the_hf_dataset_class_order():
    # HF nyu-mll/glue: mnli 0 entailment, 1 neutral, 2 contradiction; qnli/rte 0 entailment, 1 not_entailment;
    # the binary tasks' files write the class id itself.
    assert get_task("mnli").labels == ("entailment", "neutral", "contradiction")
    assert get_task("qnli").labels == get_task("rte").labels == ("entailment", "not_entailment")
    for name in ("cola", "sst2", "mrpc", "qqp", "wnli"):
        assert get_task(name).labels == ("0", "1")


def test_num_labels_and_regression():
    stsb = get_task("stsb")
    assert stsb.is_regression and stsb.num_labels == 1 and stsb.labels == ()
    assert get_task("mnli").num_labels == 3
    assert all(task.num_labels == len(task.labels) for task in TASKS.values() if not task.is_regression)


def test_splits():
    assert get_task("mnli").eval_splits == ("dev_matched", "dev_mismatched")
    assert get_task("mnli").splits == ("train", "dev_matched", "dev_mismatched")
    assert all(task.eval_splits == ("dev",) for task in TASKS.values() if task.name != "mnli")


def test_pair_tasks():
    assert {name for name, task in TASKS.items() if not task.is_pair} == {"cola", "sst2"}
    assert all(len(task.hub_text_columns) == len(task.text_columns) for task in TASKS.values())


@pytest.mark.parametrize(
    ("given", "name"),
    [("SST-2", "sst2"), ("sst-2", "sst2"), ("sst2", "sst2"), ("STS-B", "stsb"), ("MNLI", "mnli"), ("CoLA", "cola"),
     (" rte ", "rte")],
)
def test_get_task_accepts_case_and_dash_variants(given, name):
    assert get_task(given) is TASKS[name]


def test_unknown_task_lists_the_valid_ones():
    with pytest.raises(TpuplexError, match="unknown GLUE task 'squad'") as error:
        get_task("squad")
    assert all(name in str(error.value) for name in TASKS)

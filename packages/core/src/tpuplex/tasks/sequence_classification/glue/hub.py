"""GLUE splits from the HF hub (`nyu-mll/glue`) through the optional `datasets` library.

The hub's class ids follow the same label order as `Dataset.labels`, so they are used as they come.
"""

from __future__ import annotations

import numpy as np

from tpuplex.errors import DataError, TpuplexError
from tpuplex.tasks.sequence_classification.glue.datasets import Dataset
from tpuplex.tasks.sequence_classification.glue.files import Examples, check_split

HUB_DATASET = "nyu-mll/glue"


class HubUnavailableError(TpuplexError):
    """The hub cannot serve the split (library missing, offline, hub error). `reason` is the short cause."""

    def __init__(self, reason: str, fix: str):
        super().__init__(f"{reason}: {fix}")
        self.reason = reason


def hub_split_name(task: Dataset, split: str) -> str:
    """The hub's name for a tpuplex split: "dev" is "validation", MNLI's "dev_matched" is "validation_matched"."""
    check_split(task, split)
    return split.replace("dev", "validation")


def read_hub_split(task: Dataset, split: str) -> Examples:
    """Download (or read from the `datasets` cache) one labelled split of `task`."""
    hub_split = hub_split_name(task, split)
    try:
        import datasets
    except ImportError:
        raise HubUnavailableError(
            "the HF datasets library is not installed",
            "pip install datasets (and be online), or give local GLUE files with --data-dir or GLUE_DIR",
        ) from None
    try:
        data = datasets.load_dataset(HUB_DATASET, task.name, split=hub_split)
    except Exception as error:  # noqa: BLE001 - offline, hub outage, changed dataset: all end the same way for the user
        raise HubUnavailableError(
            f"{HUB_DATASET} {task.name}/{hub_split} could not be loaded from the HF hub ({type(error).__name__})",
            "check the network (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE), or give local GLUE files with --data-dir "
            "or GLUE_DIR",
        ) from None
    texts = [list(data[column]) for column in task.hub_text_columns]
    dtype = np.float32 if task.is_regression else np.int32
    labels = np.asarray(data["label"], dtype=dtype)
    if not labels.size:
        raise DataError(f"{HUB_DATASET} {task.name}/{hub_split} holds no examples: give local GLUE files "
                        "with --data-dir or GLUE_DIR")
    if not task.is_regression and (labels.min() < 0 or labels.max() >= task.num_labels):
        raise DataError(f"{HUB_DATASET} {task.name}/{hub_split} has labels outside 0..{task.num_labels - 1} "
                        "(an unlabelled split?): give local GLUE files with --data-dir or GLUE_DIR")
    return Examples(texts[0], texts[1] if task.is_pair else None, labels)

"""GLUE for tpuplex: the nine tasks, their files (or the HF hub), tokenization with a cache, and the metrics.

The trainer's entry point is `load_encoded(task, split, data_dir, tokenizer_dir, max_length, cache_dir)`, which
returns the split as static-shape `tpuplex.collate.Encoded` arrays; `compute(task, logits, labels)` scores
predictions with the task's official GLUE metrics. Your own data (`tpuplex.glue.custom`) is a task of the same
kind: `task_data(config.data)` gives the task and its splits' sources, `encode_cached` tokenizes each.
"""

from tpuplex.glue.custom import CustomData, task_data
from tpuplex.glue.features import encode, encode_cached, load_encoded, load_tokenizer
from tpuplex.glue.files import Examples, read_split
from tpuplex.glue.hub import read_hub_split
from tpuplex.glue.metrics import compute
from tpuplex.glue.tasks import TASKS, Task, get_task

__all__ = [
    "TASKS",
    "CustomData",
    "Examples",
    "Task",
    "compute",
    "encode",
    "encode_cached",
    "get_task",
    "load_encoded",
    "load_tokenizer",
    "read_hub_split",
    "read_split",
    "task_data",
]

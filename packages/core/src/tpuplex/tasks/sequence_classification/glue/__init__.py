"""GLUE, one dataset family of the sequence-classification task: the nine datasets, their files (or the HF hub).

`get_dataset("mrpc")` describes a dataset (labels, official metrics, splits, columns); `GlueData` says where its
splits come from (`glue.sources`). Reading tables and scoring are generic (`tpuplex.data.tables`,
`tpuplex.metrics`); tokenizing pairs is the task's (`tpuplex.tasks.sequence_classification.features`).
"""

from tpuplex.tasks.sequence_classification.glue.datasets import DATASETS, Dataset, get_dataset
from tpuplex.tasks.sequence_classification.glue.files import Examples, read_split
from tpuplex.tasks.sequence_classification.glue.hub import read_hub_split
from tpuplex.tasks.sequence_classification.glue.sources import GlueData, Source

__all__ = ["DATASETS", "Dataset", "Examples", "GlueData", "Source", "get_dataset", "read_hub_split", "read_split"]

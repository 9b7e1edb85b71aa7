"""GLUE, one dataset family of the sequence-classification task: the nine datasets, their files (or the HF hub).

`get_dataset("mrpc")` describes a dataset (labels, official metrics, splits, columns); `GlueData` says where its
splits come from (`tpuplex.glue.sources`). Reading tables, tokenizing and scoring are generic and live in
`tpuplex.data` and `tpuplex.metrics`.
"""

from tpuplex.glue.datasets import DATASETS, Dataset, get_dataset
from tpuplex.glue.files import Examples, read_split
from tpuplex.glue.hub import read_hub_split
from tpuplex.glue.sources import GlueData, Source

__all__ = ["DATASETS", "Dataset", "Examples", "GlueData", "Source", "get_dataset", "read_hub_split", "read_split"]

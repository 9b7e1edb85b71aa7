"""Where a GLUE split comes from: `data_dir` if given, else `$GLUE_DIR/<task folder>`, else the HF hub.

A `Source` carries a fingerprint of the data's content, so the token cache notices edited files without parsing
them: for files the SHA-256 of their bytes, for the hub a hash of the downloaded examples.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from tpuplex.errors import DataError, absence
from tpuplex.tasks.sequence_classification.glue.datasets import Dataset
from tpuplex.tasks.sequence_classification.glue.files import Examples, check_split, read_split, split_file
from tpuplex.tasks.sequence_classification.glue.hub import HubUnavailableError, read_hub_split


@dataclasses.dataclass(frozen=True)
class Source:
    """One split of one data source: `read()` returns its examples; `fingerprint` changes when its content does."""

    fingerprint: str
    read: Callable[[], Examples]


@dataclasses.dataclass(frozen=True)
class GlueData:
    """A GLUE task and where its splits come from (`data_dir`, may be empty: see `resolve_source`)."""

    dataset: Dataset
    data_dir: str

    def sources(self) -> dict[str, Source]:
        """Every labelled split, "train" first."""
        return {split: resolve_source(self.dataset, split, self.data_dir or None) for split in self.dataset.splits}

    def test_source(self) -> None:
        """Training reads no GLUE test file (prediction does: `prediction_sources`)."""
        return None

    def prediction_sources(self, split: str) -> dict[str, Source]:
        """The splits `tpuplex predict --split split` writes: "test" means every test file (both of MNLI's)."""
        task = self.dataset
        wanted = task.test_splits if split == "test" else (split,)
        return {name: resolve_source(task, name, self.data_dir or None) for name in wanted}


def resolve_source(task: Dataset, split: str, data_dir: str | Path | None) -> Source:
    """The first source that has the split, in the order data_dir, GLUE_DIR, HF hub.

    `data_dir` is the task folder (holding train.tsv, dev.tsv) or a GLUE folder holding it; when given it must
    exist, and its files are used with no fallback. When no source works, one TpuplexError lists the three ways.
    """
    check_split(task, split)
    if data_dir:
        folder = Path(data_dir).expanduser()
        if not folder.is_dir():
            raise DataError(f"data.data_dir {folder} {absence(folder)}: give the folder holding {task.folder}'s "
                            "train.tsv and dev.tsv (--data-dir)")
        return file_source(task, split, folder / task.folder if (folder / task.folder).is_dir() else folder)
    reasons = []
    glue_dir = os.environ.get("GLUE_DIR")
    if glue_dir:
        folder = Path(glue_dir).expanduser() / task.folder
        if folder.is_dir():
            return file_source(task, split, folder)
        reasons.append(f"GLUE_DIR has no {task.folder} folder ({folder})")
    else:
        reasons.append("GLUE_DIR is not set")
    try:
        return hub_source(task, split)
    except HubUnavailableError as error:
        reasons.append(error.reason)
    raise DataError(
        f"no data for GLUE task {task.name}: pass --data-dir (data.data_dir) with the folder holding "
        f"{task.folder}'s TSV files, set GLUE_DIR to the folder holding {task.folder}/, or pip install datasets "
        f"and be online ({'; '.join(reasons)})"
    )


def file_source(task: Dataset, split: str, folder: Path) -> Source:
    """The split's TSV file in the task folder. Missing folders and files raise here, before any cache lookup."""
    digest = hashlib.sha256(split_file(task, split, folder).read_bytes()).hexdigest()
    return Source(f"sha256:{digest}", lambda: read_split(task, split, folder))


def hub_source(task: Dataset, split: str) -> Source:
    """The split from the HF hub, downloaded (or read from the `datasets` cache) now to fingerprint it."""
    examples = read_hub_split(task, split)
    digest = hashlib.sha256()
    for text in (examples.text_a, examples.text_b or []):
        digest.update("\0".join(text).encode() + b"\1")
    digest.update(examples.labels.tobytes())
    return Source(f"hub-sha256:{digest.hexdigest()}", lambda: examples)

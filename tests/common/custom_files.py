"""MRPC examples written as your own data: CSV, TSV, JSONL, parquet or a `datasets` folder, with the [data] fields
that describe them (MRPC's layout, as tpuplex.tasks.sequence_classification.glue.datasets gives it for GLUE's MRPC)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tpuplex.tasks.sequence_classification.glue import get_dataset, read_split
from tpuplex.tasks.sequence_classification.glue.files import Examples

LABEL, FIRST, SECOND = "Quality", "#1 String", "#2 String"
COLUMNS = (LABEL, FIRST, SECOND)
# The MRPC layout as your own task: what the GLUE catalogue (tpuplex.tasks.sequence_classification.glue) says of
# GLUE's MRPC, written as [data] fields.
MRPC_FIELDS = {"data__data_dir": "", "task__text_columns": [FIRST, SECOND], "task__label_column": LABEL,
               "task__labels": ["0", "1"], "task__metrics": ["accuracy", "f1"]}


def records(examples: Examples) -> list[dict]:
    """One dict per example: the label as MRPC writes it ("0", "1") and both sentences."""
    return [{LABEL: str(label), FIRST: a, SECOND: b}
            for label, a, b in zip(examples.labels, examples.text_a, examples.text_b, strict=True)]


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def write_tsv(path: Path, rows: list[dict]) -> None:
    lines = ["\t".join(COLUMNS), *("\t".join(row[name] for name in COLUMNS) for row in rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    # Labels as JSON numbers: labels = ["0", "1"] must match the number 0 as it matches the CSV text "0".
    lines = (json.dumps({**row, LABEL: int(row[LABEL])}, ensure_ascii=False) for row in rows)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


WRITERS = {"csv": write_csv, "tsv": write_tsv, "jsonl": write_jsonl, "parquet": write_parquet}


def write_splits(folder: Path, kind: str, splits: dict[str, Examples]) -> dict[str, str]:
    """Each split written as `kind` into `folder`; returns split -> the path to give in [data]."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "datasets":  # one DatasetDict folder, its splits named `folder:split`
        datasets = pytest.importorskip("datasets")
        datasets.DatasetDict({split: datasets.Dataset.from_list(records(examples))
                              for split, examples in splits.items()}).save_to_disk(str(folder / "mrpc"))
        return {split: f"{folder / 'mrpc'}:{split}" for split in splits}
    paths = {split: folder / f"{split}.{kind}" for split in splits}
    for split, examples in splits.items():
        WRITERS[kind](paths[split], records(examples))
    return {split: str(path) for split, path in paths.items()}


def mrpc_splits(folder: Path) -> dict[str, Examples]:
    """train and dev of the MRPC folder `folder`, read by tpuplex's own GLUE reader."""
    return {split: read_split(get_dataset("mrpc"), split, folder) for split in ("train", "dev")}


def custom_fields(paths: dict[str, str]) -> dict:
    return {**MRPC_FIELDS, "data__train_file": paths["train"], "data__eval_files": [paths["dev"]]}

"""Fixtures of the core tests over the shared tiny checkpoint and tiny MRPC files (tests/common/tiny_glue.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_glue import MRPC_HEADER, mrpc_rows, write_mrpc, write_run_config, write_tiny_model, write_tiny_mrpc


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random BERT checkpoint (config.json, model.safetensors) with its tokenizer."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_mrpc(tmp_path_factory) -> Path:
    """A tiny MRPC folder: train.tsv (96 rows) and dev.tsv (37 rows) in the original GLUE format."""
    return write_tiny_mrpc(tmp_path_factory.mktemp("glue") / "MRPC")


@pytest.fixture
def write_config(tmp_path, tiny_model, tiny_mrpc):
    """Writes `<tmp>/config.toml` for a small numpy-backend run on the tiny model and MRPC; keyword arguments
    (`section__field=value`) change fields. Returns the config path."""
    return lambda **fields: write_run_config(tmp_path, tiny_model, tiny_mrpc, **fields)


@pytest.fixture
def broken_mrpc(tmp_path):
    """Writes `<tmp>/MRPC` with one defect and returns the folder: `defect` is "missing column" (train.tsv has
    no Quality column), "bad train label" / "bad dev label" (label 2 in the first row), or "empty train"."""

    def write(defect: str) -> Path:
        train, dev, header = mrpc_rows(16, seed=1), mrpc_rows(8, seed=2), MRPC_HEADER
        if defect == "missing column":
            header = MRPC_HEADER.replace("Quality", "Label")
        elif defect == "bad train label":
            train[0] = "2" + train[0][1:]
        elif defect == "bad dev label":
            dev[0] = "2" + dev[0][1:]
        elif defect == "empty train":
            train = []
        else:
            raise ValueError(defect)
        folder = write_mrpc(tmp_path / "MRPC", [], dev)
        (folder / "train.tsv").write_text("\n".join([header, *train]) + "\n", encoding="utf-8")
        return folder

    return write

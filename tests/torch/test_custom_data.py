"""Your own data on a framework backend: the same MRPC examples as CSV, JSONL and parquet train on torch to the
GLUE loader's losses and dev metrics, bit for bit (tests/core/test_custom_data.py checks the numpy backend)."""

from __future__ import annotations

import json

import pytest
from custom_files import custom_fields, mrpc_splits, write_splits
from tiny_glue import train_losses, write_run_config, write_tiny_model, write_tiny_mrpc

from tpuplex.commands import cli


@pytest.fixture(scope="module")
def glue_run(tmp_path_factory):
    """The tiny model, the tiny MRPC folder, and a torch run on it through the GLUE loader."""
    folder = tmp_path_factory.mktemp("glue-run")
    model, mrpc = write_tiny_model(folder / "model"), write_tiny_mrpc(folder / "MRPC")
    config = write_run_config(folder, model, mrpc, runtime__log_every=1)
    assert cli.main(["train", str(config), "--backend", "torch"]) == 0
    return model, mrpc, folder / "run"


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_each_format_trains_to_the_glue_losses_bit_for_bit(glue_run, kind, tmp_path):
    model, mrpc, glue_dir = glue_run
    paths = write_splits(tmp_path / "data", kind, mrpc_splits(mrpc))
    config = write_run_config(tmp_path, model, mrpc, runtime__log_every=1, **custom_fields(paths))
    assert cli.main(["train", str(config), "--backend", "torch"]) == 0

    expected = json.loads((glue_dir / "results.json").read_text())
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert len(train_losses(glue_dir)) == expected["total_steps"] > 0
    assert train_losses(tmp_path / "run") == train_losses(glue_dir)
    assert results["metrics"] == expected["metrics"]  # the same logits on every dev example, counted once
    assert results["eval"]["examples"] == expected["eval"]["examples"]

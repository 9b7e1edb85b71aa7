"""Every example config runs as its comment documents it: from the folder it names, with its --data-dir, a few
steps through the CLI on torch (each example is one config for every backend). Configs whose data is not in
../shared (CoLA, MNLI, QNLI, QQP, STS-B) are loaded and checked only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fresh_process import tpuplex

from tpuplex import config

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(path for path in (REPO / "examples").rglob("*.toml") if path.name != "base.toml")
GLUE_FOLDERS = {"mrpc": "MRPC", "rte": "RTE", "sst2": "SST-2", "wnli": "WNLI"}
"""GLUE datasets in ../shared/glue, by data.dataset."""


def test_every_example_config_loads():
    assert len(EXAMPLES) >= 12
    for path in EXAMPLES:
        loaded = config.load(path)
        assert loaded.train.global_batch > 0, path


def runnable(path: Path) -> bool:
    loaded = config.load(path)
    return loaded.task.name != "sequence_classification" or loaded.data.dataset in GLUE_FOLDERS


@pytest.fixture(scope="module")
def prepared_cache(tmp_path_factory) -> Path:
    """One data cache for every example: the CIFAR-10 examples share one preparation of its 60,000 images."""
    return tmp_path_factory.mktemp("cache")


@pytest.mark.parametrize("path", [p for p in EXAMPLES if runnable(p)], ids=lambda p: str(p.relative_to(REPO)))
def test_the_example_trains_as_documented(path, shared_glue, shared_text, shared_images, prepared_cache, tmp_path):
    loaded = config.load(path)
    # Image and custom-model examples say "Run from this folder"; the text ones run from the repository.
    folder = path.parent if loaded.model.architecture or loaded.task.name == "image_classification" else REPO
    args = ["train", str(path.relative_to(folder)), "--backend", "torch", "--set", "train.max_steps=2",
            "--set", f'runtime.output_dir="{tmp_path / "run"}"', "--set", f'data.cache_dir="{prepared_cache}"']
    if loaded.task.name == "sequence_classification":
        # The documented --data-dir, relative to the folder the command runs from.
        up = Path("..") if folder == REPO else Path("../../..")
        args += ["--data-dir", str(up / "shared" / "glue" / GLUE_FOLDERS[loaded.data.dataset])]
    tpuplex(*args, cwd=folder)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["step"] == 2 and results["metrics"]

"""Every example config runs as its comment documents it, from the repository root, with its --data-dir, a few
steps through the CLI on torch (each example is one config for every backend), then its whole evaluation. The fast
tier runs each on a cut of its real data (tests/common/shared_subset.py: the first rows or images of every file) at
8 rows a step; the long tier on all of it (CIFAR-10's 60,000 images, SST-2's 67,000 sentences) at its own batch.
Configs whose data is not in ../shared (CoLA, MNLI, QNLI, QQP, STS-B) are loaded and checked only."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from fresh_process import tpuplex
from shared_subset import SMALL_BATCH, subset_path

from tpuplex import config

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
TRACKED = subprocess.run(["git", "ls-files", "-z", "examples"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.split("\0")
EXAMPLES = sorted(REPO / name for name in TRACKED if name.endswith(".toml") and Path(name).name != "base.toml")
"""The configs git tracks: a scratch or hidden .toml beside them is no example."""
GLUE_FOLDERS = {"mrpc": "MRPC", "rte": "RTE", "sst2": "SST-2", "wnli": "WNLI"}
"""GLUE datasets in ../shared/glue, by data.dataset."""


def test_every_example_config_loads():
    assert len(EXAMPLES) >= 12
    for path in EXAMPLES:
        loaded = config.load(path)
        assert loaded.train.global_batch > 0, path


def reads_glue(loaded: config.Config) -> bool:
    """The config trains on a GLUE dataset's files (data.data_dir): sequence classification, or text to text
    without a table of its own."""
    return (loaded.task.name == "sequence_classification"
            or loaded.task.name == "seq2seq" and not loaded.data.train_file)


def runnable(path: Path) -> bool:
    loaded = config.load(path)
    return not reads_glue(loaded) or loaded.data.dataset in GLUE_FOLDERS


@pytest.fixture(scope="module")
def prepared_cache(tmp_path_factory) -> Path:
    """One data cache for every example: the CIFAR-10 examples share one preparation of their images."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def subset_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shared-subset")


RUNNABLE = [p for p in EXAMPLES if runnable(p)]
LONG_EVEN_AS_SUBSET = {REPO / "examples" / "shakespeare_char" / "gpu.toml",
                       *(REPO / "examples" / "glue" / "configs" / f"{name}.toml" for name in ("sst2", "rte")),
                       *(REPO / "examples" / "smollm2" / f"sst2_{name}.toml" for name in ("lora", "full")),
                       REPO / "examples" / "glue" / "configs" / "mrpc_tune.toml", REPO / "examples" / "t5" / "rte.toml"}
"""gpu.toml: two steps of 64 x 256 tokens on a 10.7M-parameter GPT take 30-40 s on 2 cores, and its torch_mode
"cuda_graphs" compiles them here (cpu.toml covers the code). SST-2 and RTE: 30-46 s each, the same code and
settings as the MRPC and WNLI configs but their files (tests/core/test_example_paths.py loads them). The SmolLM2
examples: 135M parameters read and evaluated on 300 conversations, minutes; tests/torch/test_lora.py runs LoRA
through the CLI on a small Llama, and each backend's SmolLM2 check reads the same model. mrpc_tune.toml: mrpc.toml
with a [tune] table `train` ignores (25 s); tests/core/test_tune.py runs the search itself. t5/rte.toml: t5/mrpc.toml
on RTE's files."""
THROUGH_THE_API = {REPO / name for name in ("examples/glue/configs/mrpc.toml", "examples/ner/wnut17.toml",
                                             "examples/mlm/tinyshakespeare.toml", "examples/cifar10/resnet20.toml",
                                             "examples/shakespeare_char/cpu.toml", "examples/speech/fsdd.toml")}
"""Run at the subset scale by tests/torch/test_api.py instead: the same command on the same cut of the data in a
fresh process, then the same run through the Python API compared with it (one run of each, not two)."""
CASES = [pytest.param(path, scale, id=f"{path.relative_to(REPO)}-{scale}",
                      marks=pytest.mark.long if scale == "all" or path in LONG_EVEN_AS_SUBSET else ())
         for path in RUNNABLE for scale in ("subset", "all") if scale == "all" or path not in THROUGH_THE_API]


@pytest.mark.parametrize(("path", "scale"), CASES)
def test_the_example_trains_as_documented(path, scale, shared_glue, shared_text, shared_images, shared_audio,
                                          prepared_cache, subset_root, tmp_path):
    loaded = config.load(path)
    # Every example runs from the repository root (a config's own paths are relative to its file, so they hold from
    # any folder: tests/core/test_example_paths.py loads each from its own folder too).
    folder = REPO

    def data(relative: str, whole: bool = False) -> str:
        """The documented path, or its subset's (absolute) at the fast tier."""
        return relative if scale == "all" or whole else str(subset_path(SHARED, folder / relative, subset_root))

    args = ["train", str(path.relative_to(folder)), "--backend", "torch", "--set", "train.max_steps=2",
            "--set", f'runtime.output_dir="{tmp_path / "run"}"', "--set", f'data.cache_dir="{prepared_cache}"']
    if scale != "all":
        args += ["--set", f"train.global_batch={SMALL_BATCH}"]
    if reads_glue(loaded):
        # The documented --data-dir, relative to the folder the command runs from.
        args += ["--data-dir", data(str(Path("..") / "shared" / "glue" / GLUE_FOLDERS[loaded.data.dataset]))]
    elif scale != "all":
        # A tagging example trains on its whole file: every tag of its (cut) evaluation files must occur in it.
        whole = loaded.task.name == "token_classification"
        args += ["--set", f"data.train_file={json.dumps(data(loaded.data.train_file, whole))}",
                 "--set", f"data.eval_files={json.dumps([data(name) for name in loaded.data.eval_files])}"]
    tpuplex(*args, cwd=folder)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["step"] == 2 and results["metrics"]
    train = results["train"]  # a model of your own (custom_model, flowers) counted by torch's counter; its MFU is
    # omitted when above the peak measured under another load (tests/core/test_cli.py)
    assert train["model_tflops_per_s"] > 0 and (train["mfu"] is None or 0 < train["mfu"] <= 1)

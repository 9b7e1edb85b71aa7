"""A task defined outside tpuplex (`smoothing/`: sequence classification with label smoothing, written for the
three frameworks) trains through the CLI on every backend, imported from the config file's folder: 20
dropout-off steps on real MRPC give losses within 1e-3 relative of each other, and not the built-in task's."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from fresh_process import tpuplex
from tiny_glue import train_losses, write_tiny_model_reading

pytestmark = pytest.mark.started_first

BACKENDS = ("torch", "jax", "tf")
SMOOTHING = Path(__file__).parent / "smoothing"


@pytest.fixture(scope="module")
def losses(tmp_path_factory, minilm_dir, shared_glue) -> dict[str, list[float]]:
    folder = tmp_path_factory.mktemp("own-task")
    for module in SMOOTHING.glob("*.py"):
        shutil.copy(module, folder / module.name)
    model = write_tiny_model_reading(folder / "model", minilm_dir)
    found = {}
    for name, task in (("smoothing", "smoothing:TASK"), ("built-in", "sequence_classification")):
        config = folder / f"{name}.toml"
        runs = folder / "runs" / name
        config.write_text(f'[task]\nname = "{task}"\n[model]\ncheckpoint = "{model}"\ndropout = false\n'
                          f'[data]\ndataset = "mrpc"\ndata_dir = "{shared_glue / "MRPC"}"\nmax_length = 64\n'
                          f'buckets = [32]\ncache_dir = "{folder / "cache"}"\n'
                          '[train]\nlearning_rate = 1e-3\nmax_steps = 20\nglobal_batch = 16\n'
                          f'[runtime]\noutput_dir = "{runs}/{{backend}}"\nlog_every = 1\n')
        for backend in BACKENDS if name == "smoothing" else ("torch",):
            tpuplex("train", str(config), "--backend", backend)
            found[f"{name}-{backend}"] = [loss for _, loss, _ in train_losses(runs / backend)]
    return found


def test_every_backend_trains_the_external_task_alike(losses):
    reference = losses["smoothing-torch"]
    assert len(reference) == 20
    for backend in ("jax", "tf"):
        np.testing.assert_allclose(losses[f"smoothing-{backend}"], reference, rtol=1e-3)


def test_the_external_loss_is_not_the_built_in_one(losses):
    """The same first parameters give another loss (near ln 2 for two classes smoothing moves it little, but far
    more than float32 rounding), and the two runs then train apart."""
    plain, smoothed = np.array(losses["built-in-torch"]), np.array(losses["smoothing-torch"])
    assert abs(smoothed[0] - plain[0]) > 1e-5 and np.abs(smoothed - plain).max() > 1e-3

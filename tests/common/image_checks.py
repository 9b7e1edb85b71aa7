"""Checks of image classification shared by the backend sessions: the example's flowers CNN
(examples/flowers/flowers_cnn, the real extension a user writes) on the real flower photos, prepared small."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from tpuplex import checkpoint
from tpuplex.collate import Batcher
from tpuplex.data import images
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex.tasks.image_classification import TASK, ImageData
from tpuplex.tasks.image_classification.data import ImageSplit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flowers"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))

FLOWERS_CNN = "flowers_cnn.{backend}_model:FlowersCNN"
OPTIMIZER = OptimizerSpec(seed=3, weight_decay=1e-4)
SIZE = 32


def flowers(shared_images: Path, folder: Path) -> ImageData:
    """The flower photos prepared at 32 x 32 into `folder`, 64 of them as the training split (crops and flips on)."""
    prepared = images.prepare(images.scan_folder(shared_images / "flowers"), folder, (SIZE, SIZE))
    members = np.arange(0, len(prepared), len(prepared) // 64, dtype=np.int64)[:64]
    split = ImageSplit(prepared, members)
    return ImageData("flowers", split, {}, prepared.classes, seed=5, crop_padding=4, flip=True)


def spec(data: ImageData, dropout: bool = True) -> ModelSpec:
    head = TASK.head(None, None, {}, data)
    return ModelSpec(task=TASK, head=head, hf_config={}, params={}, architecture=FLOWERS_CNN, dropout=dropout,
                     model_arguments=TASK.model_arguments(data, head, 0))


def batches(data: ImageData, count: int) -> list[dict[str, np.ndarray]]:
    """The first `count` training batches of 16 images, augmented as the Trainer augments them (step 1, 2, ...)."""
    found = list(Batcher(data.train, 16, 1, seed=1).train_batches(0))[:count]
    return [data.train_batch(batch, step) for step, batch in enumerate(found, start=1)]


def train(backend, model: ModelSpec, steps, state=None):
    state = backend.init(model, OPTIMIZER) if state is None else state
    losses = []
    for batch in steps:
        state, loss = backend.train_step(state, batch, 3e-3)
        losses.append(loss)
    return state, losses


def check_resume_equals_uninterrupted(make_backend, data: ImageData, folder: Path) -> None:
    """Four steps in one go equal two, a checkpoint written to disk and read into a fresh backend, and two more:
    the same losses, parameters and batch-norm statistics, bit for bit."""
    steps = batches(data, 4)
    whole_backend = make_backend()
    whole, whole_losses = train(whole_backend, spec(data), steps)
    first_backend = make_backend()
    first, first_losses = train(first_backend, spec(data), steps[:2])
    saved = checkpoint.save(folder, first_backend.state_to_arrays(first), {}, keep=1)
    resumed_backend = make_backend()
    loaded, _ = checkpoint.load(saved)
    assert loaded.buffers, "the checkpoint carries the batch-norm statistics"
    resumed = resumed_backend.state_from_arrays(resumed_backend.init(spec(data), OPTIMIZER), loaded)
    resumed, resumed_losses = train(resumed_backend, spec(data), steps[2:], resumed)
    assert first_losses + resumed_losses == whole_losses
    final, expected = resumed_backend.state_to_arrays(resumed), whole_backend.state_to_arrays(whole)
    for kind in ("params", "buffers", "exp_avg", "exp_avg_sq"):
        got, want = getattr(final, kind), getattr(expected, kind)
        assert got.keys() == want.keys() and all(np.array_equal(got[name], want[name]) for name in want), kind

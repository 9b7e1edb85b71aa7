"""Checks of image classification shared by the backend sessions: the example's flowers CNN
(examples/flowers/flowers_cnn, the real extension a user writes) on the real flower photos, prepared small."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from tpuplex.data import images
from tpuplex.data.batching import Batcher
from tpuplex.engine import checkpoint
from tpuplex.protocol import ModelSpec, OptimizerSpec, PortableState
from tpuplex.tasks.image_classification import TASK, ImageData
from tpuplex.tasks.image_classification.data import ImageSplit
from tpuplex.testing.specs import own_model_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flowers"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))

FLOWERS_CNN = "flowers_cnn.{backend}_model:FlowersCNN"
OPTIMIZER = OptimizerSpec(seed=3, weight_decay=1e-4)
LEARNING_RATE = 3e-4
"""Of the cross-framework comparison (`check_follows_torch`): below the rate where float32 itself decides the
trajectory (docs/images.md, "Same numbers on every backend")."""
SIZE = 32


def flowers(shared_images: Path, folder: Path) -> ImageData:
    """The flower photos prepared at 32 x 32 into `folder`, 64 of them as the training split (crops and flips on)."""
    prepared = images.prepare(images.scan_folder(shared_images / "flowers"), folder, (SIZE, SIZE))
    members = np.arange(0, len(prepared), len(prepared) // 64, dtype=np.int64)[:64]
    split = ImageSplit(prepared, members)
    return ImageData("flowers", split, {}, prepared.classes, seed=5, crop_padding=4, flip=True)


def spec(data: ImageData, dropout: bool = True) -> ModelSpec:
    return own_model_spec(TASK, data, FLOWERS_CNN, dropout=dropout)


def batches(data: ImageData, count: int) -> list[dict[str, np.ndarray]]:
    """The first `count` training batches of 16 images (4 an epoch), augmented as the Trainer augments them."""
    batcher = Batcher(data.train, 16, 1, seed=1)
    found = [batch for epoch in range(-(-count // 4)) for batch in batcher.train_batches(epoch)][:count]
    return [data.train_batch(batch, step) for step, batch in enumerate(found, start=1)]


def train(backend, model: ModelSpec, steps, state=None, learning_rate: float = 3e-3):
    state = backend.init(model, OPTIMIZER) if state is None else state
    losses = []
    for batch in steps:
        state, loss = backend.train_step(state, batch, learning_rate)
        losses.append(loss)
    return state, losses


def check_images_held_on_the_device_train_as_the_host_s(make_backend, data: ImageData) -> None:
    """task.images_on_device: the device holds the training images (`Backend.hold`) and each batch carries only
    the rows' indices, shifts and flips; the crops and flips the step makes from them are the host's to the pixel, so
    four dropout-off steps give the host path's losses, and the model FLOPs counted are the same (XLA's count adds
    the crops' few compares and selects: within 1%)."""
    held = dataclasses.replace(data, train=dataclasses.replace(data.train, by_index=True))
    on_device = batches(held, 4)
    assert "images" not in on_device[0] and set(held.held()) == {"train_images"}
    host_backend, device_backend = make_backend(), make_backend()
    device_backend.hold(held.held())
    host_state, host_losses = train(host_backend, spec(data, dropout=False), batches(data, 4))
    device_state, device_losses = train(device_backend, spec(held, dropout=False), on_device)
    np.testing.assert_allclose(device_losses, host_losses, rtol=1e-6)
    counted = device_backend.forward_flops(device_state, on_device[0])
    assert counted == pytest.approx(host_backend.forward_flops(host_state, batches(data, 1)[0]), rel=0.01)


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


def torch_to_native(arrays: dict[str, np.ndarray], framework: str) -> dict[str, np.ndarray]:
    """The torch FlowersCNN's parameters or buffers under the `framework` ("jax" or "tf") model's names and
    layouts (convolution kernels [out, in, h, w] -> [h, w, in, out], dense [out, in] -> [in, out]); the batch-norm
    step counter, which only torch keeps, is dropped."""
    jax_names = {"weight": "scale", "bias": "bias", "running_mean": "mean", "running_var": "var"}
    tf_names = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}
    converted = {}
    for name, array in arrays.items():
        module, leaf = name.rsplit(".", 1)
        if module == "classifier":
            converted[f"classifier.{'kernel' if leaf == 'weight' else 'bias'}"] = array.T if leaf == "weight" else array
            continue
        position = int(module.split(".")[1])  # features.<4 * block + layer>
        block, layer = divmod(position, 4)
        if layer == 0:
            converted[f"conv_{block}.kernel" if framework == "jax" else f"convolutions.{block}.kernel"] = \
                array.transpose(2, 3, 1, 0)
        elif leaf != "num_batches_tracked":
            if framework == "jax":
                stats = leaf.startswith("running")
                converted[f"{'batch_stats.' if stats else ''}norm_{block}.{jax_names[leaf]}"] = array
            else:
                converted[f"norms.{block}.{tf_names[leaf]}"] = array
    return {name: np.ascontiguousarray(array, np.float32) for name, array in converted.items()}


def check_follows_torch(make_backend, framework: str, data: ImageData, steps: int = 20) -> None:
    """From the torch model's initial weights, `steps` dropout-off steps on the same augmented batches give
    losses within 1e-3 relative of the torch backend's, at LEARNING_RATE."""
    from tpuplex.config import RuntimeConfig
    from tpuplex_torch.backend import TorchBackend

    batches_ = batches(data, steps)
    torch_backend = TorchBackend(RuntimeConfig(torch_mode="eager"))
    torch_state = torch_backend.init(spec(data, dropout=False), OPTIMIZER)
    start = torch_backend.state_to_arrays(torch_state)
    _, torch_losses = train(torch_backend, spec(data, dropout=False), batches_, torch_state, LEARNING_RATE)
    backend = make_backend()
    state = backend.init(spec(data, dropout=False), OPTIMIZER)
    params = torch_to_native(start.params, framework)
    zeros = {name: np.zeros_like(array) for name, array in params.items()}
    state = backend.state_from_arrays(state, PortableState(params, zeros, dict(zeros), 0,
                                                           torch_to_native(start.buffers, framework)))
    _, losses = train(backend, spec(data, dropout=False), batches_, state, LEARNING_RATE)
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-3)
    assert torch_losses[-1] < torch_losses[0]  # it learns: the comparison is not between two constant curves


def check_killed_and_resumed(backend: str, backend_class: str, shared_images: Path, folder: Path, kills: int) -> None:
    """The real flowers example through the CLI (at 32 x 32, crops, flips and dropout on), SIGKILLed `kills` times
    (tests/common/kill_campaign.py: inside checkpoint writes, at steps after a checkpoint, during start-up), then
    finished: parameters, Adam moments and batch-norm statistics equal an uninterrupted run's, bit for bit."""
    import json

    from kill_campaign import run_campaign

    killed, whole = folder / "killed", folder / "whole"

    def argv(output_dir: Path) -> list[str]:
        return ["train", str(EXAMPLE / "flowers.toml"), "--backend", backend, "--set", "task.image_size=[32, 32]",
                "--set", f"data.train_file={json.dumps(str(shared_images / 'flowers'))}",
                "--set", f"train.max_steps={max(30, 10 * kills)}", "--set", "runtime.checkpoint_every=2",
                "--set", "runtime.eval_every=10",
                "--set", f"data.cache_dir={json.dumps(str(folder / 'cache'))}",
                "--set", f"runtime.output_dir={json.dumps(str(output_dir))}"]

    landed = run_campaign(argv(killed), killed, argv(whole), whole, backend_class, kills=kills, checkpoint_every=2,
                          startup_seconds=6.0)
    print("kills landed:", landed)
    assert len(landed) == kills


def check_state_is_not_trained(make_backend, data: ImageData, buffers: set[str]) -> dict[str, np.ndarray]:
    """After two training steps the state holds the non-trainable `buffers` (at least), none of which has Adam
    moments, and the first of them has moved off its initial zeros. Returns the buffers."""
    backend = make_backend()
    state, losses = train(backend, spec(data), batches(data, 2))
    arrays = backend.state_to_arrays(state)
    assert buffers <= set(arrays.buffers) and not set(arrays.buffers) & set(arrays.exp_avg)
    assert not np.allclose(arrays.buffers[sorted(buffers)[0]], 0.0)
    assert all(np.isfinite(losses))
    return arrays.buffers


def predicted_run(backend: str, shared_images: Path, folder: Path, every: int) -> tuple[Path, Path, list[dict]]:
    """A 6-step flowers run at 48 x 48 on `backend` through the CLI and `tpuplex predict` of every `every`-th flower
    photo (copied into `<folder>/photos`): (the run, the photos, the prediction TSV's rows)."""
    import csv
    import shutil

    from fresh_process import tpuplex

    run, photos = folder / "run", folder / "photos"
    tpuplex("train", "flowers.toml", "--backend", backend, "--set", "train.max_steps=6",
            "--set", "task.image_size=[48, 48]", "--set", f'runtime.output_dir="{run}"',
            "--set", f'data.cache_dir="{folder / "cache"}"', cwd=EXAMPLE)
    photos.mkdir()
    for path in sorted((shared_images / "flowers").rglob("*.jpg"))[::every]:
        shutil.copy(path, photos / f"{path.parent.name}-{path.name}")
    tpuplex("predict", str(run), "--backend", backend, "--split", str(photos), "--out", str(folder / "predicted"))
    with (folder / "predicted" / "photos.tsv").open() as handle:
        return run, photos, list(csv.DictReader(handle, delimiter="\t"))

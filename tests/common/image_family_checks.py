"""Checks of the image families (ResNet, ViT) shared by the backend sessions: logits equal transformers' own
classes, training follows the torch backend, portable checkpoints cross backends, batch norm across replicas.

Tiny random configs written by the test (`write_config`); the reference is HF transformers (torch), which every
backend session installs (the torch backend comes with the jax and tf sessions for these comparisons).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import transformers

import torch
from tpuplex.config import RuntimeConfig
from tpuplex.protocol import Backend, ModelSpec, OptimizerSpec, PortableState
from tpuplex.testing.specs import image_family_spec
from tpuplex_torch.backend import TorchBackend

NUM_LABELS, SIZE = 3, 16
CONFIGS = {
    "resnet-basic": {"model_type": "resnet", "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 2],
                     "layer_type": "basic"},
    "resnet-bottleneck": {"model_type": "resnet", "embedding_size": 8, "hidden_sizes": [16, 32], "depths": [2, 1],
                          "layer_type": "bottleneck", "downsample_in_bottleneck": True,
                          "downsample_in_first_stage": True},
    "vit": {"model_type": "vit", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 32, "image_size": SIZE, "patch_size": 4},
}
CIFAR_STEM = {"embedding_kernel_size": 3, "embedding_stride": 1, "embedding_pooling": False}
"""The CIFAR ResNet's stem (`tpuplex.models.resnet`), which HF's own class cannot build."""
TRAINING = {"resnet-cifar": {**CONFIGS["resnet-basic"], **CIFAR_STEM}, "vit": CONFIGS["vit"]}
OPTIMIZER = OptimizerSpec(weight_decay=0.01, seed=1)
LEARNING_RATE = 1e-3
STATE_BOUND = 2 * LEARNING_RATE
"""How far the final parameters and statistics may be from torch's after 20 steps. Adam moves a parameter whose
gradient is mostly float32 rounding by up to the learning rate each step, whatever its size: the same ResNet on 1
and 8 JAX replicas ends 1.4e-4 apart, JAX (and tf) and torch 6.8e-4 apart, while the losses agree to 5e-5
relative (2026-11-25, the 2-core VM). The losses carry the 1e-3 bound."""


def write_config(folder: Path, config: dict) -> Path:
    """A checkpoint folder holding config.json alone: a model tpuplex draws from scratch."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def spec_with_statistics(folder: Path, **fields) -> ModelSpec:
    """The family's spec with running statistics drawn away from 0 and 1, so evaluation mode is checked too."""
    spec = image_family_spec(folder, NUM_LABELS, **fields)
    rng = np.random.default_rng(7)
    buffers = {name: (rng.uniform(0.5, 1.5, b.shape) if name.endswith("running_var") else
                      rng.normal(0.0, 0.1, b.shape)).astype(np.float32) if b.dtype == np.float32 else b + 5
               for name, b in spec.buffers.items()}
    return dataclasses.replace(spec, buffers=buffers)


def images(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, SIZE, SIZE, 3), dtype=np.uint8)


def hf_logits(spec: ModelSpec, pixels: np.ndarray) -> np.ndarray:
    """transformers' own *ForImageClassification, in evaluation mode, with the spec's weights."""
    settings = dict(spec.hf_config)
    config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings, num_labels=NUM_LABELS)
    model = transformers.AutoModelForImageClassification.from_config(config).eval()
    model.load_state_dict({name: torch.from_numpy(np.array(a)) for name, a in {**spec.params, **spec.buffers}.items()},
                          strict=True)
    with torch.no_grad():
        return model(torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255.0).logits.numpy()


def check_logits_equal_hf(make_backend: Callable[[], Backend], folder: Path) -> None:
    """Every family's logits (evaluation mode: running statistics) within 1e-4 of transformers'."""
    pixels = images(8)
    for name, config in CONFIGS.items():
        spec = spec_with_statistics(write_config(folder / name, config))
        backend = make_backend()
        ours = backend.predict(backend.init(spec, OPTIMIZER), {"images": pixels})
        expected = hf_logits(spec, pixels)
        assert ours.shape == (8, NUM_LABELS)
        np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0, err_msg=name)
        assert np.ptp(expected, axis=0).max() > 1e-3, f"{name}: the images must give different logits"


def train(backend: Backend, spec: ModelSpec, steps: int = 20, optimizer: OptimizerSpec = OPTIMIZER,
          resume_at: int = 0) -> tuple[list[float], PortableState]:
    """`steps` updates on batches of 16 random labelled images (batch norm in training mode); the losses and
    final state. (16 rows: TensorFlow 2.21's CPU kernels corrupt memory when 8 MirroredStrategy replicas train
    convolutions on one image each.)"""
    rng = np.random.default_rng(0)
    state = backend.init(spec, optimizer)
    losses = []
    for step in range(steps):
        if resume_at and step == resume_at:  # through the portable state, into a fresh state
            state = backend.state_from_arrays(backend.init(spec, optimizer), backend.state_to_arrays(state))
        batch = {"images": images(16, seed=step), "labels": rng.integers(0, NUM_LABELS, 16).astype(np.int32),
                 "weight": np.ones(16, np.float32)}
        state, loss = backend.train_step(state, batch, LEARNING_RATE)
        losses.append(loss)
    return losses, backend.state_to_arrays(state)


def check_training_follows_torch(make_backend: Callable[[], Backend], folder: Path) -> None:
    """20 steps with dropout off: every loss within 1e-3 relative of the torch backend's, the final parameters
    and batch-norm statistics within STATE_BOUND, every count 20 (`make_backend` may run several replicas: batch
    norm is cross-replica by default, so they train as torch's one)."""
    for name, config in TRAINING.items():
        spec = image_family_spec(write_config(folder / name, config), NUM_LABELS, dropout=False)
        expected_losses, expected = train(TorchBackend(RuntimeConfig(device="cpu")), spec)
        losses, got = train(make_backend(), spec)
        np.testing.assert_allclose(losses, expected_losses, rtol=1e-3, err_msg=name)
        assert abs(expected_losses[-1] - expected_losses[0]) > 1e-3, f"{name}: training must move the loss"
        for what in ("params", "buffers"):
            mine, theirs = getattr(got, what), getattr(expected, what)
            assert mine.keys() == theirs.keys()
            for key in theirs:
                np.testing.assert_allclose(mine[key], theirs[key], rtol=0, atol=STATE_BOUND, err_msg=f"{name} {key}")
        counts = [value for key, value in got.buffers.items() if key.endswith("num_batches_tracked")]
        assert all(int(count) == 20 for count in counts) and got.step == 20


SGD = dataclasses.replace(OPTIMIZER, optimizer="sgd", momentum=0.9, nesterov=True, weight_decay=5e-4)
"""The usual ResNet recipe's update (torch.optim.SGD, Nesterov momentum, weight decay added to the gradient)."""


def check_sgd_follows_torch_and_resumes(make_backend: Callable[[], Backend], folder: Path) -> None:
    """SGD with Nesterov momentum: 20 losses within 1e-3 relative of the torch backend's (torch.optim.SGD), and a
    run resumed at step 10 through the portable state (the momentum buffer is its exp_avg) ends bit for bit where
    the uninterrupted run ends."""
    spec = image_family_spec(write_config(folder / "resnet", TRAINING["resnet-cifar"]), NUM_LABELS, dropout=False)
    expected_losses, expected = train(TorchBackend(RuntimeConfig(device="cpu")), spec, optimizer=SGD)
    losses, state = train(make_backend(), spec, optimizer=SGD)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-3)
    assert abs(expected_losses[-1] - expected_losses[0]) > 1e-3
    assert max(np.abs(v).max() for v in state.exp_avg.values()) > 0
    assert all(not np.any(v) for v in state.exp_avg_sq.values())
    resumed_losses, resumed = train(make_backend(), spec, optimizer=SGD, resume_at=10)
    assert resumed_losses == losses and resumed.step == state.step == 20
    for what in ("params", "exp_avg", "buffers"):
        assert all(np.array_equal(getattr(resumed, what)[k], v) for k, v in getattr(state, what).items()), what


def check_reads_torch_checkpoint(make_backend: Callable[[], Backend], folder: Path) -> None:
    """A state the torch backend trained (parameters, moments, statistics) read by this backend predicts what
    torch predicts, and comes back out unchanged."""
    for name, config in TRAINING.items():
        spec = image_family_spec(write_config(folder / name, config), NUM_LABELS)
        torch_backend = TorchBackend(RuntimeConfig(device="cpu"))
        _, trained = train(torch_backend, spec, steps=3)
        pixels = images(8, seed=99)
        torch_logits = torch_backend.predict(torch_backend.state_from_arrays(torch_backend.init(spec, OPTIMIZER),
                                                                             trained), {"images": pixels})
        backend = make_backend()
        state = backend.state_from_arrays(backend.init(spec, OPTIMIZER), trained)
        np.testing.assert_allclose(backend.predict(state, {"images": pixels}), torch_logits, atol=1e-5,
                                   err_msg=name)
        back = backend.state_to_arrays(state)
        for key, value in trained.buffers.items():
            assert back.buffers[key].dtype == value.dtype and np.array_equal(back.buffers[key], value), key
        assert all(np.array_equal(back.params[key], value) for key, value in trained.params.items())


def check_per_replica_differs(make_backend: Callable[[], Backend], folder: Path) -> None:
    """model.batch_norm = "per_replica" on several replicas (`make_backend`) normalises each replica's rows
    alone: its losses differ from the cross-replica ones, which equal one replica's
    (`check_training_follows_torch`)."""
    spec = image_family_spec(write_config(folder / "resnet", TRAINING["resnet-cifar"]), NUM_LABELS, dropout=False)
    cross, _ = train(make_backend(), spec, steps=2)
    per_replica, _ = train(make_backend(), dataclasses.replace(spec, batch_norm="per_replica"), steps=2)
    assert abs(cross[0] - per_replica[0]) > 1e-4


def check_bf16_follows_float32(make_backend: Callable[[], Backend], folder: Path) -> None:
    """train.bf16 (bfloat16 compute, float32 parameters, batch-norm statistics and loss) trains the CIFAR-stem
    ResNet with every one of 50 losses within 2e-2 relative of float32's (measured 1.1-1.4e-3 on each backend)."""
    spec = image_family_spec(write_config(folder / "resnet", TRAINING["resnet-cifar"]), NUM_LABELS, dropout=False)
    float32, _ = train(make_backend(), spec, steps=50)
    bfloat16, state = train(make_backend(), spec, steps=50, optimizer=dataclasses.replace(OPTIMIZER, bf16=True))
    np.testing.assert_allclose(bfloat16, float32, rtol=2e-2)
    assert bfloat16 != float32, "bfloat16 must change the arithmetic"
    assert all(value.dtype in (np.float32, np.int64) for value in state.buffers.values())

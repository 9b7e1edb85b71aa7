"""Helpers shared by the eager (tests/torch) and XLA (tests/torch_xla) test sessions."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tpuplex.checkpoints import read_hf_config
from tpuplex.config import RuntimeConfig
from tpuplex.data.batching import Batcher, Encoded
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex.testing.specs import classifier_spec
from tpuplex.testing.tiny_bert import write_tiny_bert
from tpuplex_torch.backend import TorchBackend

MAX_LENGTH = 16
BUCKETS = (8,)


def model_spec(checkpoint_dir: Path, num_labels: int = 2, dropout: bool = False) -> ModelSpec:
    """The core's initial parameters for `checkpoint_dir` (classifier drawn with seed 0)."""
    hf_config = read_hf_config(checkpoint_dir)
    return classifier_spec(checkpoint_dir, hf_config, num_labels, 0, dropout=dropout, checkpoint_dir=checkpoint_dir)


def tiny_spec(directory: Path, **kwargs) -> ModelSpec:
    return model_spec(write_tiny_bert(directory), **kwargs)


def encoded(rows: int, vocab: int = 128, max_length: int = MAX_LENGTH, seed: int = 0) -> Encoded:
    """A random split with lengths 2..max_length (so both buckets are used), right-padded with 0."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, max_length + 1, rows).astype(np.int32)
    real = np.arange(max_length)[None, :] < lengths[:, None]
    ids = np.where(real, rng.integers(1, vocab, (rows, max_length)), 0).astype(np.int32)
    segments = np.where(real & (np.arange(max_length)[None, :] >= lengths[:, None] // 2), 1, 0).astype(np.int32)
    return Encoded(ids, segments, lengths, rng.integers(0, 2, rows).astype(np.int32))


def train_batches(global_batch: int, count: int, replicas: int = 1, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """`count` static-shape training batches from the core's Batcher (epoch 0, both bucket lengths)."""
    batcher = Batcher(encoded(global_batch * count * 2, seed=seed), global_batch, replicas, BUCKETS, seed=seed)
    return list(batcher.train_batches(0))[:count]


def learning_rates(count: int, peak: float = 1e-3) -> list[float]:
    """A warmup-like sequence starting at 0, as the core's schedule does."""
    return [peak * step / count for step in range(count)]


def run(backend: TorchBackend, spec: ModelSpec, batches, rates, optimizer: OptimizerSpec | None = None):
    """Initialise and train on `batches`; returns (state, losses)."""
    state = backend.init(spec, optimizer or OptimizerSpec())
    return backend.train_steps(state, batches, rates)


def backend(torch_mode: str = "eager", cpu_devices: int = 0) -> TorchBackend:
    return TorchBackend(RuntimeConfig(torch_mode=torch_mode, cpu_devices=cpu_devices))


def assert_params_close(left, right, atol: float) -> None:
    """Every parameter of two PortableStates equal within `atol`, naming the worst one otherwise."""
    assert left.params.keys() == right.params.keys()
    worst = max(left.params, key=lambda name: float(np.max(np.abs(left.params[name] - right.params[name]))))
    error = float(np.max(np.abs(left.params[worst] - right.params[worst])))
    assert error <= atol, f"{worst} differs by {error:.3g} > {atol}"

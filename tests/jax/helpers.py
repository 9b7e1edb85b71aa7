"""Helpers for the JAX backend tests: model specs, seeded splits and batches, backends on N CPU devices."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tpuplex.checkpoints import read_hf_config
from tpuplex.config import RuntimeConfig
from tpuplex.data.batching import Encoded
from tpuplex.protocol import ModelSpec
from tpuplex.testing.specs import classifier_spec
from tpuplex_jax.backend import JaxBackend


def model_spec(checkpoint_dir: Path, num_labels: int = 2, dropout: bool = False, seed: int = 0) -> ModelSpec:
    hf_config = read_hf_config(checkpoint_dir)
    return classifier_spec(checkpoint_dir, hf_config, num_labels, seed, dropout=dropout, checkpoint_dir=checkpoint_dir)


def backend(devices: int, **runtime) -> JaxBackend:
    return JaxBackend(RuntimeConfig(cpu_devices=devices, **runtime))


def encoded_split(size: int, max_length: int = 16, vocab: int = 128, num_labels: int = 2, seed: int = 0) -> Encoded:
    """A random tokenized split: lengths in [3, max_length], [CLS]=1 first, a second segment after the middle."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, max_length + 1, size).astype(np.int32)
    positions = np.arange(max_length)[None, :]
    real = positions < lengths[:, None]
    input_ids = np.where(real, rng.integers(2, vocab, (size, max_length)), 0).astype(np.int32)
    input_ids[:, 0] = 1
    token_type_ids = (real & (positions >= lengths[:, None] // 2)).astype(np.int32)
    labels = (rng.standard_normal(size).astype(np.float32) if num_labels == 1
              else rng.integers(0, num_labels, size).astype(np.int32))
    return Encoded(input_ids=input_ids, token_type_ids=token_type_ids, lengths=lengths, labels=labels)


def batch_of(data: Encoded, rows: slice | np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Rows of `data` as one host batch at full length, all weights 1."""
    rows = slice(None) if rows is None else rows
    lengths = data.lengths[rows]
    return {
        "input_ids": data.input_ids[rows], "token_type_ids": data.token_type_ids[rows],
        "attention_mask": (np.arange(data.max_length)[None, :] < lengths[:, None]).astype(np.int32),
        "labels": data.labels[rows], "weight": np.ones(len(lengths), np.float32),
    }

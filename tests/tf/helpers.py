"""Test helpers shared by the TF tests and the resume worker process (no TensorFlow import here)."""

from __future__ import annotations

import numpy as np

from tpuplex.checkpoints import read_hf_config
from tpuplex.data.batching import Encoded
from tpuplex.protocol import ModelSpec
from tpuplex.testing.specs import classifier_spec

LOGICAL_CPUS = 8


def model_spec(checkpoint_dir, num_labels: int = 2, dropout: bool = False, seed: int = 0) -> ModelSpec:
    hf_config = read_hf_config(checkpoint_dir)
    return classifier_spec(checkpoint_dir, hf_config, num_labels, seed, dropout=dropout, checkpoint_dir=checkpoint_dir)


def random_split(size: int, max_length: int, vocab: int = 128, seed: int = 0, num_labels: int = 2) -> Encoded:
    """A tokenized split of random ids with lengths spread over [3, max_length] (two segments each)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, max_length + 1, size).astype(np.int32)
    positions = np.arange(max_length)[None, :]
    input_ids = np.where(positions < lengths[:, None], rng.integers(1, vocab, (size, max_length)), 0)
    token_type_ids = ((positions >= lengths[:, None] // 2) & (positions < lengths[:, None])).astype(np.int32)
    labels = rng.integers(0, num_labels, size).astype(np.int32)
    return Encoded(input_ids=input_ids.astype(np.int32), token_type_ids=token_type_ids, lengths=lengths,
                   labels=labels)

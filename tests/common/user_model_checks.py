"""Checks of the user-model extension point (`model.architecture`) shared by the backend sessions.

They train a TextCNN written in each framework (`native_textcnn`, beside this file: the framework-native path a
user with a module of their own takes) on random batches, imported as `native_textcnn.{backend}_model` as a
user's module is.
"""

from __future__ import annotations

import numpy as np

from tpuplex.data.batching import Batcher, Encoded
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex.testing.specs import user_classifier_spec

TEXTCNN = "native_textcnn.{backend}_model:TextCNN"
VOCAB = 64


def spec(architecture: str = TEXTCNN, num_labels: int = 2, dropout: bool = True) -> ModelSpec:
    return user_classifier_spec(architecture, num_labels, VOCAB, dropout=dropout)


def batches(count: int, global_batch: int = 8, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """`count` training batches of random ids whose label is whether token 5 occurs (learnable by a CNN)."""
    rng = np.random.default_rng(seed)
    rows, length = global_batch * count * 2, 16  # two buckets, each dropping its partial batch
    lengths = rng.integers(3, length + 1, rows).astype(np.int32)
    real = np.arange(length)[None, :] < lengths[:, None]
    ids = np.where(real, rng.integers(1, VOCAB, (rows, length)), 0).astype(np.int32)
    labels = (ids == 5).any(axis=1).astype(np.int32)
    data = Encoded(ids, np.zeros_like(ids), lengths, labels)
    found = list(Batcher(data, global_batch, 1, buckets=(8,), seed=seed).train_batches(0))[:count]
    assert len(found) == count
    return found


def train(backend, model: ModelSpec, steps: list[dict[str, np.ndarray]], state=None):
    """(state, losses) after training on `steps` from `state` (a fresh init when None), lr 1e-2."""
    state = backend.init(model, OptimizerSpec(seed=3)) if state is None else state
    losses = []
    for batch in steps:
        state, loss = backend.train_step(state, batch, 1e-2)
        losses.append(loss)
    return state, losses


def check_the_framework_counts_its_forward_flops(backend, padding_taps: bool, exact: bool) -> None:
    """MFU for a model of your own: the backend's framework counts TextCNN's forward on a batch [B, L]. By hand its
    convolutions are 2 E F multiply-adds per tap of a width-w kernel at each of the L positions, and its classifier
    2 B (3 F) n. torch's counter and TensorFlow's profiler count the w taps at every position (`padding_taps`),
    XLA only those inside the row ((w^2 - 1) / 8 fewer at each end of it); torch's count is exactly the hand
    count (`exact`), XLA's and TensorFlow's add the element-wise work (bias additions, ReLU, the max), a few
    percent. Counting compiles nothing."""
    from native_textcnn import EMBEDDING_SIZE, FILTERS, WIDTHS

    state = backend.init(spec(), OptimizerSpec(seed=3))
    batch = batches(1)[0]
    rows, length = batch["input_ids"].shape
    taps = sum(length * width - (0 if padding_taps else (width**2 - 1) // 4) for width in WIDTHS)
    by_hand = 2 * rows * EMBEDDING_SIZE * FILTERS * taps + 2 * rows * FILTERS * len(WIDTHS) * 2
    compiled = backend.compile_count()
    counted = backend.forward_flops(state, batch)
    assert counted == by_hand if exact else by_hand < counted < 1.05 * by_hand, (counted, by_hand)
    assert backend.compile_count() == compiled


def check_resume_equals_uninterrupted(make_backend) -> None:
    """Six steps in one go equal three, a portable round trip into a fresh backend, and three more: the same
    losses and final parameters, bit for bit (dropout on: its masks depend on the seed and step only)."""
    steps = batches(6)
    backend = make_backend()
    whole, whole_losses = train(backend, spec(), steps)
    first_backend = make_backend()
    first, first_losses = train(first_backend, spec(), steps[:3])
    saved = first_backend.state_to_arrays(first)
    resumed_backend = make_backend()
    resumed = resumed_backend.state_from_arrays(resumed_backend.init(spec(), OptimizerSpec(seed=3)), saved)
    resumed, resumed_losses = train(resumed_backend, spec(), steps[3:], resumed)
    assert first_losses + resumed_losses == whole_losses
    final, expected = resumed_backend.state_to_arrays(resumed), backend.state_to_arrays(whole)
    assert final.params.keys() == expected.params.keys() and final.step == expected.step == 6
    assert all(np.array_equal(final.params[name], expected.params[name]) for name in expected.params)

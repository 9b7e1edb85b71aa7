"""A network written once (`tpuplex.nn.Network`: `written_once.AttentionPool`, not the example's TextCNN) runs on
torch, jax and tf from the same initial weights, drawn by the core: 20 dropout-off steps give the same losses on
the three, and a checkpoint written on torch evaluates on jax and tf to the same logits and dev accuracy."""

from __future__ import annotations

import numpy as np
import pytest
import user_model_checks as checks

from tpuplex.config import RuntimeConfig
from tpuplex.engine import checkpoint
from tpuplex.protocol import OptimizerSpec
from tpuplex.testing.specs import network_classifier_spec
from tpuplex_jax.backend import JaxBackend
from tpuplex_tf.backend import TfBackend
from tpuplex_torch.backend import TorchBackend

BACKENDS = {"torch": TorchBackend, "jax": JaxBackend, "tf": TfBackend}
ARCHITECTURE = "written_once:AttentionPool"
LOSS_TOLERANCE = 1e-4
"""Per-step losses of three frameworks' float32 kernels, 20 steps in: the same numbers up to summation order."""


def spec(dropout: bool = False):
    return network_classifier_spec(ARCHITECTURE, 2, checks.VOCAB, seed=5, dropout=dropout)


def train(name: str, steps: list[dict[str, np.ndarray]]):
    backend = BACKENDS[name](RuntimeConfig(cpu_devices=1))
    state = backend.init(spec(), OptimizerSpec(seed=3))
    losses = []
    for batch in steps:
        state, loss = backend.train_step(state, batch, 3e-3)
        losses.append(loss)
    return backend, state, np.array(losses)


@pytest.fixture(scope="module")
def torch_run():
    return train("torch", checks.batches(20))


@pytest.mark.parametrize("name", ["jax", "tf"])
def test_twenty_steps_give_the_same_losses_on_every_backend(torch_run, name):
    _, _, expected = torch_run
    assert expected[-1] < 0.75 * expected[0]  # it learns: the comparison is of a run, not of a constant
    _, _, losses = train(name, checks.batches(20))
    np.testing.assert_allclose(losses, expected, atol=LOSS_TOLERANCE, rtol=0)


def test_a_torch_checkpoint_evaluates_alike_on_jax_and_tf(torch_run, tmp_path):
    backend, state, _ = torch_run
    written = checkpoint.save(tmp_path / "checkpoints", backend.state_to_arrays(state), {"step": 20}, keep=1)
    arrays, _ = checkpoint.load(written)
    assert set(arrays.params) == set(spec().params)  # the names `params()` declares, on disk
    dev = checks.batches(4, seed=7)
    expected = np.concatenate([backend.predict(state, batch) for batch in dev])
    labels = np.concatenate([batch["labels"] for batch in dev])
    accuracy = (expected.argmax(-1) == labels).mean()
    for name in ("jax", "tf"):
        reader = BACKENDS[name](RuntimeConfig(cpu_devices=1))
        restored = reader.state_from_arrays(reader.init(spec(), OptimizerSpec(seed=3)), arrays)
        logits = np.concatenate([reader.predict(restored, batch) for batch in dev])
        np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=0, err_msg=name)
        assert (logits.argmax(-1) == labels).mean() == accuracy

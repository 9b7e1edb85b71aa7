"""Every family on TensorFlow: logits equal HF transformers (torch), training follows the torch backend, and the
Keras variables' HF names are exactly the family's."""

from __future__ import annotations

import numpy as np
import pytest
from hf_families import FAMILIES, eval_batch, hf_logits, model_spec, train_batches, train_losses, write_checkpoint

from tpuplex.config import RuntimeConfig
from tpuplex.params import expected_shapes
from tpuplex.protocol import OptimizerSpec
from tpuplex_tf.backend import TfBackend
from tpuplex_torch.backend import TorchBackend


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tmp_path_factory):
    return write_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


def tf_backend() -> TfBackend:
    return TfBackend(RuntimeConfig(cpu_devices=1))


@pytest.mark.parametrize("num_labels", [3, 1])
def test_logits_match_hf(family_dir, num_labels):
    spec = model_spec(family_dir, num_labels=num_labels)
    batch = eval_batch(family_dir, num_labels=num_labels)
    backend = tf_backend()
    logits = backend.predict(backend.init(spec, OptimizerSpec()), batch)
    assert logits.shape == (6, num_labels)
    np.testing.assert_allclose(logits, hf_logits(spec, batch), atol=1e-4, rtol=0)


def test_twenty_steps_follow_the_torch_backend(family_dir):
    spec = model_spec(family_dir)
    batches = train_batches(family_dir, global_batch=8, count=20)
    expected = train_losses(TorchBackend(RuntimeConfig()), spec, batches)
    np.testing.assert_allclose(train_losses(tf_backend(), spec, batches), expected, rtol=1e-3)
    assert np.mean(expected[-5:]) < np.mean(expected[:5])  # the steps really train


def test_parameter_names_are_the_family_s(family_dir):
    spec = model_spec(family_dir)
    backend = tf_backend()
    params = backend.state_to_arrays(backend.init(spec, OptimizerSpec())).params
    shapes = expected_shapes(spec.hf_config, spec.num_labels)
    assert {name: array.shape for name, array in params.items()} == shapes
    assert all(np.array_equal(params[name], spec.params[name]) for name in shapes)

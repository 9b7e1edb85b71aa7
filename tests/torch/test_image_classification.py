"""Image classification on the torch backend: the example's flowers CNN, its batch-norm statistics in the state
and the checkpoint, resumed exactly."""

from __future__ import annotations

import image_checks as checks
import numpy as np
from helpers import backend


def test_flowers_cnn_resumes_exactly_with_its_batch_norm_statistics(shared_images, tmp_path):
    data = checks.flowers(shared_images, tmp_path / "flowers")
    checks.check_resume_equals_uninterrupted(backend, data, tmp_path / "checkpoints")


def test_batch_norm_statistics_are_state_the_optimizer_never_touches(shared_images, tmp_path):
    data = checks.flowers(shared_images, tmp_path / "flowers")
    torch_backend = backend()
    state, losses = checks.train(torch_backend, checks.spec(data), checks.batches(data, 2))
    arrays = torch_backend.state_to_arrays(state)
    assert {"features.1.running_mean", "features.1.running_var", "features.1.num_batches_tracked"} <= set(
        arrays.buffers)
    assert not set(arrays.buffers) & set(arrays.exp_avg)
    assert int(arrays.buffers["features.1.num_batches_tracked"]) == 2
    assert not np.allclose(arrays.buffers["features.1.running_mean"], 0.0)
    assert all(np.isfinite(losses))


def test_the_flowers_example_killed_and_resumed_ends_as_an_uninterrupted_run(shared_images, tmp_path):
    checks.check_killed_and_resumed("torch", "tpuplex_torch.backend:TorchBackend", shared_images, tmp_path, kills=4)

"""Image classification on the torch backend: the example's flowers CNN, its batch-norm statistics in the state
and the checkpoint, resumed exactly."""

from __future__ import annotations

import image_checks as checks
from helpers import backend


def test_flowers_cnn_resumes_exactly_with_its_batch_norm_statistics(shared_images, tmp_path):
    data = checks.flowers(shared_images, tmp_path / "flowers")
    checks.check_resume_equals_uninterrupted(backend, data, tmp_path / "checkpoints")


def test_batch_norm_statistics_are_state_the_optimizer_never_touches(shared_images, tmp_path):
    buffers = checks.check_state_is_not_trained(backend, checks.flowers(shared_images, tmp_path / "flowers"),
                                                {"features.1.running_mean", "features.1.running_var",
                                                 "features.1.num_batches_tracked"})
    assert int(buffers["features.1.num_batches_tracked"]) == 2


def test_the_flowers_example_killed_and_resumed_ends_as_an_uninterrupted_run(shared_images, tmp_path):
    checks.check_killed_and_resumed("torch", "tpuplex_torch.backend:TorchBackend", shared_images, tmp_path, kills=4)

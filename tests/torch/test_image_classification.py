"""Image classification on the torch backend: the example's flowers CNN, its batch-norm statistics in the state
and the checkpoint, resumed exactly."""

from __future__ import annotations

import image_checks as checks
import pytest
from helpers import backend


def test_flowers_cnn_resumes_exactly_with_its_batch_norm_statistics(flowers_data, tmp_path):
    checks.check_resume_equals_uninterrupted(backend, flowers_data, tmp_path / "checkpoints")


def test_batch_norm_statistics_are_state_the_optimizer_never_touches(flowers_data, tmp_path):
    buffers = checks.check_state_is_not_trained(backend, flowers_data,
                                                {"features.1.running_mean", "features.1.running_var",
                                                 "features.1.num_batches_tracked"})
    assert int(buffers["features.1.num_batches_tracked"]) == 2


@pytest.mark.parametrize("kills", [3, pytest.param(10, marks=pytest.mark.long)])
def test_the_flowers_example_killed_and_resumed_ends_as_an_uninterrupted_run(kills, shared_images, tmp_path):
    checks.check_killed_and_resumed("torch", "tpuplex_torch.backend:TorchBackend", shared_images, tmp_path, kills)

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


def test_training_images_held_on_the_device_train_as_the_host_s(flowers_data):
    checks.check_images_held_on_the_device_train_as_the_host_s(backend, flowers_data)


def test_the_device_s_crops_and_flips_are_the_host_s_to_the_pixel(flowers_data):
    """`crop_and_flip` (the step's, over the op table) against `augment` (the host's) with the same draws, padding
    4 and 8 (a shift larger than the image's margin), flips on and off."""
    import numpy as np

    import torch
    from tpuplex.tasks.image_classification.data import augment, augmentation_rows, crop_and_flip
    from tpuplex_torch.ops import TorchOps

    images = flowers_data.train.images_held()
    index = np.arange(0, 64, 3)
    for padding, flip in ((4, True), (8, True), (4, False)):
        drawn = augmentation_rows(np.random.default_rng(padding), len(index), padding, flip)
        on_device = crop_and_flip(TorchOps(False, torch.device("cpu")), torch.from_numpy(images),
                                  torch.from_numpy(index.astype(np.int32)),
                                  *(torch.from_numpy(drawn[name]) for name in ("shift", "flip")))
        np.testing.assert_array_equal(on_device.numpy(), augment(images[index], np.random.default_rng(padding),
                                                                 padding, flip))


@pytest.mark.parametrize("kills", [3, pytest.param(10, marks=pytest.mark.long)])
def test_the_flowers_example_killed_and_resumed_ends_as_an_uninterrupted_run(kills, shared_images, tmp_path):
    checks.check_killed_and_resumed("torch", "tpuplex_torch.backend:TorchBackend", shared_images, tmp_path, kills)

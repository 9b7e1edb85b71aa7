"""Image classification on the JAX backend: the example's Flax flowers CNN, its batch statistics in the state and
the checkpoint, resumed exactly, on one device and on two."""

from __future__ import annotations

import image_checks as checks
import pytest
from helpers import backend


@pytest.mark.parametrize("devices", [1, 2])
def test_flowers_cnn_resumes_exactly_with_its_batch_statistics(devices, flowers_data, tmp_path):
    checks.check_resume_equals_uninterrupted(lambda: backend(devices), flowers_data, tmp_path / "checkpoints")


def test_batch_statistics_are_state_the_optimizer_never_touches(flowers_data, tmp_path):
    checks.check_state_is_not_trained(lambda: backend(1), flowers_data,
                                      {"batch_stats.norm_0.mean", "batch_stats.norm_0.var"})


def test_training_images_held_on_the_devices_train_as_the_host_s(flowers_data):
    checks.check_images_held_on_the_device_train_as_the_host_s(lambda: backend(2), flowers_data)


def test_twenty_dropout_off_steps_follow_the_torch_backend(flowers_data, tmp_path):
    checks.check_follows_torch(lambda: backend(1), "jax", flowers_data)


@pytest.mark.long  # the fast tier kills the torch run (3 kills) and the numpy backend's (10): docs/testing.md
def test_the_flowers_example_killed_and_resumed_ends_as_an_uninterrupted_run(shared_images, tmp_path):
    checks.check_killed_and_resumed("jax", "tpuplex_jax.backend:JaxBackend", shared_images, tmp_path, kills=10)

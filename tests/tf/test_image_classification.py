"""Image classification on the TF backend: the example's Keras flowers CNN, its batch-norm moving statistics in
the state and the checkpoint, resumed exactly, on one replica and on two."""

from __future__ import annotations

import image_checks as checks
import pytest

from tpuplex.config import RuntimeConfig
from tpuplex_tf.backend import TfBackend


def backend(replicas: int) -> TfBackend:
    return TfBackend(RuntimeConfig(cpu_devices=replicas))


@pytest.mark.parametrize("replicas", [1, 2])
def test_flowers_cnn_resumes_exactly_with_its_batch_norm_statistics(replicas, flowers_data, tmp_path):
    checks.check_resume_equals_uninterrupted(lambda: backend(replicas), flowers_data, tmp_path / "checkpoints")


def test_moving_statistics_are_state_the_optimizer_never_touches(flowers_data, tmp_path):
    checks.check_state_is_not_trained(lambda: backend(1), flowers_data,
                                      {"norms.0.moving_mean", "norms.0.moving_variance"})


def test_twenty_dropout_off_steps_follow_the_torch_backend(flowers_data, tmp_path):
    checks.check_follows_torch(lambda: backend(1), "tf", flowers_data)


@pytest.mark.long  # the fast tier kills the torch run (3 kills) and the numpy backend's (10): docs/testing.md
def test_the_flowers_example_killed_and_resumed_ends_as_an_uninterrupted_run(shared_images, tmp_path):
    checks.check_killed_and_resumed("tf", "tpuplex_tf.backend:TfBackend", shared_images, tmp_path, kills=10)

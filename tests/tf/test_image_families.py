"""ResNet and ViT on the tf backend (MirroredStrategy over logical CPUs: 2 in the fast tier, all 8 in the long
tier, where each check takes 3-4 times as long): transformers' logits, the torch backend's training, its
checkpoints, and batch norm across replicas (tests/common/image_family_checks.py)."""

from __future__ import annotations

from collections.abc import Callable

import image_family_checks as checks
import numpy as np
import pytest
import tensorflow as tf
from helpers import LOGICAL_CPUS

import torch
from tpuplex.config import RuntimeConfig
from tpuplex_tf.backend import TfBackend
from tpuplex_tf.ops import TfOps

pytestmark = pytest.mark.started_first  # the tf session's longest file (2-replica training on each check)


@pytest.fixture(params=[2, pytest.param(LOGICAL_CPUS, marks=pytest.mark.long)], ids=lambda count: f"{count}-replicas")
def replicas(request) -> Callable[[], TfBackend]:
    return lambda: TfBackend(RuntimeConfig(cpu_devices=request.param))


def test_logits_equal_transformers(replicas, tmp_path):
    checks.check_logits_equal_hf(replicas, tmp_path)


def test_replicas_train_as_the_torch_backend(replicas, tmp_path):
    checks.check_training_follows_torch(replicas, tmp_path)


def test_reads_a_torch_checkpoint(replicas, tmp_path):
    checks.check_reads_torch_checkpoint(replicas, tmp_path)


def test_per_replica_batch_norm_is_a_choice(replicas, tmp_path):
    checks.check_per_replica_differs(replicas, tmp_path)


def test_sgd_follows_the_torch_backend_and_resumes_exactly(replicas, tmp_path):
    checks.check_sgd_follows_torch_and_resumes(replicas, tmp_path)


def test_bf16_trains_as_float32_does(tmp_path):
    checks.check_bf16_follows_float32(lambda: TfBackend(RuntimeConfig(cpu_devices=1)), tmp_path)


@pytest.mark.parametrize(("kernel", "stride"), [(1, 1), (1, 2), (2, 1), (3, 1), (3, 2), (4, 1), (7, 2)])
def test_a_convolution_pads_as_torch_does(kernel, stride):
    """kernel // 2 on each side, whether TensorFlow's "SAME" or an explicit pad does it (strided or even kernels)."""
    rng = np.random.default_rng(0)
    images = rng.standard_normal((2, 9, 9, 3)).astype(np.float32)
    weight = rng.standard_normal((4, 3, kernel, kernel)).astype(np.float32)  # OIHW
    outputs = TfOps(None).conv2d_nhwc(tf.constant(images), tf.constant(weight), stride, kernel // 2).numpy()
    expected = torch.nn.functional.conv2d(torch.from_numpy(images).permute(0, 3, 1, 2), torch.from_numpy(weight),
                                          stride=stride, padding=kernel // 2).permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(outputs, expected, atol=1e-5)

"""ResNet and ViT on the tf backend (MirroredStrategy over 8 logical CPUs): transformers' logits, the torch
backend's training, its checkpoints, and batch norm across replicas (tests/common/image_family_checks.py)."""

from __future__ import annotations

import image_family_checks as checks
from helpers import LOGICAL_CPUS

from tpuplex.config import RuntimeConfig
from tpuplex_tf.backend import TfBackend


def replicas() -> TfBackend:
    return TfBackend(RuntimeConfig(cpu_devices=LOGICAL_CPUS))


def test_logits_equal_transformers(tmp_path):
    checks.check_logits_equal_hf(replicas, tmp_path)


def test_eight_replicas_train_as_the_torch_backend(tmp_path):
    checks.check_training_follows_torch(replicas, tmp_path)


def test_reads_a_torch_checkpoint(tmp_path):
    checks.check_reads_torch_checkpoint(replicas, tmp_path)


def test_per_replica_batch_norm_is_a_choice(tmp_path):
    checks.check_per_replica_differs(replicas, tmp_path)


def test_sgd_follows_the_torch_backend_and_resumes_exactly(tmp_path):
    checks.check_sgd_follows_torch_and_resumes(replicas, tmp_path)


def test_bf16_trains_as_float32_does(tmp_path):
    checks.check_bf16_follows_float32(lambda: TfBackend(RuntimeConfig(cpu_devices=1)), tmp_path)

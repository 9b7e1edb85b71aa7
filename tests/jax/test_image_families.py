"""ResNet and ViT on the JAX backend (8 replicas): transformers' logits, the torch backend's training, its
checkpoints, and batch norm across replicas (tests/common/image_family_checks.py)."""

from __future__ import annotations

import image_family_checks as checks
from helpers import backend


def test_logits_equal_transformers(tmp_path):
    checks.check_logits_equal_hf(lambda: backend(8), tmp_path)


def test_eight_replicas_train_as_the_torch_backend(tmp_path):
    checks.check_training_follows_torch(lambda: backend(8), tmp_path)


def test_reads_a_torch_checkpoint(tmp_path):
    checks.check_reads_torch_checkpoint(lambda: backend(8), tmp_path)


def test_per_replica_batch_norm_is_a_choice(tmp_path):
    checks.check_per_replica_differs(lambda: backend(8), tmp_path)


def test_sgd_follows_the_torch_backend_and_resumes_exactly(tmp_path):
    checks.check_sgd_follows_torch_and_resumes(lambda: backend(8), tmp_path)


def test_bf16_trains_as_float32_does(tmp_path):
    checks.check_bf16_follows_float32(lambda: backend(1), tmp_path)

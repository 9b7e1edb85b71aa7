"""Masked-LM text and image folders train from prepared shards as from the same rows in memory, bit for bit
(tests/common/prepared_checks.py); GLUE and your own CSV are checked in tests/core."""

from __future__ import annotations

import hf_families as families
import pytest
from prepared_checks import check_prepared_equals_in_memory, flowers_config, masked_lm_config


@pytest.mark.long  # the data path is the core's: the torch session runs it in the fast tier
def test_a_prepared_corpus_trains_as_the_rows_in_memory(shared_text, tmp_path) -> None:
    checkpoint = families.write_checkpoint("bert", tmp_path / "bert")
    metrics = check_prepared_equals_in_memory(masked_lm_config(checkpoint, shared_text, tmp_path), "jax",
                                              tmp_path / "runs")
    assert set(metrics) == {"held-out"} and metrics["held-out"]["loss"] > 0


@pytest.mark.long  # the data path is the core's: the torch session runs it in the fast tier
def test_prepared_images_train_as_the_images_in_memory(shared_images, tmp_path) -> None:
    metrics = check_prepared_equals_in_memory(flowers_config(shared_images, tmp_path), "jax", tmp_path / "runs")
    assert set(metrics) == {"validation"}

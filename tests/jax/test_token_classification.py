"""Token classification on every family on jax: logits equal HF transformers' `*ForTokenClassification`, training
on aligned tags follows the torch backend (tests/common/ner_checks.py)."""

from __future__ import annotations

import hf_families as families
import ner_checks
import pytest
from helpers import backend


@pytest.fixture(scope="module", params=families.FAMILIES)
def family_dir(request, tmp_path_factory):
    return families.write_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


def test_logits_match_hf(family_dir):
    ner_checks.check_logits_match_hf(backend(2), family_dir)


@pytest.mark.parametrize("family_dir", families.HEADS_TRAINED_FAST, indirect=True)
def test_twenty_steps_follow_the_torch_backend(family_dir):
    ner_checks.check_training_follows_torch(backend(1), family_dir)

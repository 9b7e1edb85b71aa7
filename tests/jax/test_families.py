"""Every family on JAX: logits equal HF transformers (torch), training follows the torch backend, and the Flax
tree's HF names are exactly the family's (the checks are tests/common/hf_families.py's)."""

from __future__ import annotations

import hf_families as families
import pytest
from helpers import backend


@pytest.fixture(scope="module", params=families.FAMILIES)
def family_dir(request, tmp_path_factory):
    return families.write_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("num_labels", [3, 1])
def test_logits_match_hf(family_dir, num_labels):
    families.check_logits_match_hf(backend(2), family_dir, num_labels)


def test_twenty_steps_follow_the_torch_backend(family_dir):
    families.check_training_follows_torch(backend(1), family_dir)


def test_parameter_names_are_the_family_s(family_dir):
    families.check_parameter_names(backend(1), family_dir)

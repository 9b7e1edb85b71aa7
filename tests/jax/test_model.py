"""Logits equal HF torch BertForSequenceClassification built from the same core-resolved weights."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import backend, batch_of, encoded_split, model_spec
from transformers import BertConfig, BertForSequenceClassification

import torch
from tpuplex.protocol import OptimizerSpec


def torch_reference(spec) -> BertForSequenceClassification:
    reference = BertForSequenceClassification(BertConfig(**spec.hf_config, num_labels=spec.num_labels))
    weights = {name: torch.from_numpy(np.asarray(array)) for name, array in spec.params.items()}
    reference.load_state_dict(weights, strict=True)
    return reference.eval()


def torch_logits(reference, batch) -> np.ndarray:
    with torch.no_grad():
        return reference(**{name: torch.from_numpy(batch[name]).long()
                            for name in ("input_ids", "token_type_ids", "attention_mask")}).logits.numpy()


@pytest.mark.parametrize("num_labels", [2, 1])
def test_tiny_bert_logits_match_torch(tiny_dir, num_labels):
    spec = model_spec(tiny_dir, num_labels=num_labels)
    batch = batch_of(encoded_split(16, num_labels=num_labels))
    jax_backend = backend(8)
    logits = jax_backend.predict(jax_backend.init(spec, OptimizerSpec()), batch)
    expected = torch_logits(torch_reference(spec), batch)
    assert logits.shape == (16, num_labels)
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


def test_minilm_logits_match_torch(minilm_dir):
    spec = model_spec(minilm_dir, num_labels=3)
    data = encoded_split(8, max_length=32, vocab=spec.hf_config["vocab_size"], seed=1)
    batch = batch_of(data)
    jax_backend = backend(1)
    logits = jax_backend.predict(jax_backend.init(spec, OptimizerSpec()), batch)
    np.testing.assert_allclose(logits, torch_logits(torch_reference(spec), batch), atol=1e-4, rtol=0)


def test_bf16_compute_stays_close_to_float32(tiny_dir):
    spec = model_spec(tiny_dir)
    batch = batch_of(encoded_split(8))
    full, half = backend(1), backend(1)
    expected = full.predict(full.init(spec, OptimizerSpec()), batch)
    state = half.init(spec, OptimizerSpec(bf16=True))
    assert half.state_to_arrays(state).params["classifier.weight"].dtype == np.float32  # parameters stay fp32
    # bf16 keeps 8 mantissa bits: logits of this size agree to a few 1e-3, not to fp32 precision.
    np.testing.assert_allclose(half.predict(state, batch), expected, atol=2e-2, rtol=0)
    assert not np.array_equal(half.predict(state, batch), expected)

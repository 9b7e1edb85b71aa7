"""Logit parity of the tpuplex torch classifier with HF transformers' BertForSequenceClassification."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import backend, encoded, model_spec, tiny_spec
from transformers import BertConfig, BertForSequenceClassification

import torch
from tpuplex.data.batching import Batcher
from tpuplex.errors import TpuplexError
from tpuplex.protocol import OptimizerSpec


def reference_logits(spec, batch) -> np.ndarray:
    """HF's own model, built as the issue prescribes, in eval mode, with its own 2D-mask path."""
    reference = BertForSequenceClassification(BertConfig(**spec.hf_config, num_labels=spec.num_labels))
    reference.load_state_dict({name: torch.from_numpy(np.asarray(a)) for name, a in spec.params.items()}, strict=True)
    reference.eval()
    with torch.no_grad():
        return reference(**{key: torch.from_numpy(batch[key]).long()
                            for key in ("input_ids", "token_type_ids", "attention_mask")}).logits.numpy()


def padded_batch(vocab: int, rows: int = 6, max_length: int = 24) -> dict[str, np.ndarray]:
    """One evaluation batch with padding of different lengths (and a padding row, weight 0)."""
    batcher = Batcher(encoded(rows - 1, vocab=vocab, max_length=max_length, seed=3), rows, 1)
    return next(iter(batcher.eval_batches())).batch


@pytest.mark.parametrize("num_labels", [2, 1])
def test_tiny_bert_logits_match_hf(tmp_path, num_labels):
    spec = tiny_spec(tmp_path, num_labels=num_labels)
    batch = padded_batch(vocab=128, max_length=16)
    torch_backend = backend()
    logits = torch_backend.predict(torch_backend.init(spec, OptimizerSpec()), batch)
    assert logits.shape == (6, num_labels) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, reference_logits(spec, batch), atol=1e-4, rtol=0)


def test_minilm_logits_match_hf(minilm_dir):
    spec = model_spec(minilm_dir, num_labels=3)
    batch = padded_batch(vocab=30522)
    torch_backend = backend()
    logits = torch_backend.predict(torch_backend.init(spec, OptimizerSpec()), batch)
    np.testing.assert_allclose(logits, reference_logits(spec, batch), atol=1e-4, rtol=0)


def test_initial_parameters_that_do_not_fit_the_model_are_named(tmp_path):
    spec = tiny_spec(tmp_path)
    params = dict(spec.params)
    params["classifier.weight"] = np.zeros((5, 32), np.float32)
    del params["bert.pooler.dense.bias"]
    with pytest.raises(TpuplexError, match=r"missing: bert.pooler.dense.bias.*wrong shape: classifier.weight"):
        backend().init(dataclasses.replace(spec, params=params, dropout=False), OptimizerSpec())

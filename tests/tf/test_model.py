"""Logits equal HF transformers' torch BertForSequenceClassification (fp32, eval mode) to 1e-4."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import model_spec, random_split
from transformers import BertConfig, BertForSequenceClassification

import torch
from tpuplex.config import RuntimeConfig
from tpuplex.data.batching import Batcher
from tpuplex.protocol import OptimizerSpec
from tpuplex_tf.backend import TfBackend


def torch_logits(spec, batch) -> np.ndarray:
    config = {key: value for key, value in spec.hf_config.items() if key not in ("architectures", "model_type")}
    reference = BertForSequenceClassification(BertConfig(**config, num_labels=spec.num_labels)).eval()
    weights = {name: torch.from_numpy(np.asarray(array)) for name, array in spec.params.items()}
    reference.load_state_dict(weights, strict=True)
    with torch.no_grad():
        return reference(input_ids=torch.from_numpy(batch["input_ids"]).long(),
                         token_type_ids=torch.from_numpy(batch["token_type_ids"]).long(),
                         attention_mask=torch.from_numpy(batch["attention_mask"]).long()).logits.numpy()


@pytest.mark.parametrize("checkpoint", ["tiny", "minilm"])
def test_logits_match_hf_torch(checkpoint, tiny_dir, request):
    directory = tiny_dir if checkpoint == "tiny" else request.getfixturevalue("minilm_dir")
    spec = model_spec(directory, num_labels=3)
    vocab = int(spec.hf_config["vocab_size"])
    batch = next(Batcher(random_split(6, 24, vocab=vocab, seed=1), global_batch=6, replicas=1).eval_batches()).batch
    assert batch["attention_mask"].min() == 0  # padded keys are exercised
    backend = TfBackend(RuntimeConfig(cpu_devices=1))
    logits = backend.predict(backend.init(spec, OptimizerSpec()), batch)
    expected = torch_logits(spec, batch)
    assert logits.shape == expected.shape == (6, 3)
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)

"""The token-classification checks every backend session runs on every family: logits equal HF transformers'
`*ForTokenClassification` (torch), and 20 training steps on aligned tags follow the torch backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import transformers
from hf_families import follows_torch

import torch
from tpuplex.checkpoints import read_hf_config
from tpuplex.data.batching import Batcher
from tpuplex.data.tokenize import load_tokenizer
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex.tasks.token_classification import data as tagged
from tpuplex.tasks.token_classification import scored
from tpuplex.testing.specs import token_classifier_spec
from tpuplex_torch.testing import SENTENCES

MAX_LENGTH = 16
TAGS = ("B-ORG", "B-PER", "I-ORG", "I-PER", "O")


def spec(directory: Path) -> ModelSpec:
    return token_classifier_spec(directory, read_hf_config(directory), len(TAGS), dropout=False,
                                 checkpoint_dir=directory)


def batches(directory: Path, global_batch: int, count: int) -> list[dict[str, np.ndarray]]:
    """`count` batches of the tiny sentences with random tags, aligned by the family's tokenizer (long sentences
    cut at MAX_LENGTH), as the task's training batches."""
    rng = np.random.default_rng(0)
    words = [sentence.split() for sentence in SENTENCES] * 4
    tags = [[TAGS[index] for index in rng.integers(0, len(TAGS), len(sentence))] for sentence in words]
    sentences = tagged.Sentences(directory, words, tags, list(range(len(words))))
    aligned = tagged.align(sentences, load_tokenizer(directory, MAX_LENGTH), MAX_LENGTH, TAGS)
    raw, epoch = [], 0
    while len(raw) < count:
        raw += Batcher(aligned.encoded, global_batch, 1, seed=0).train_batches(epoch)
        epoch += 1
    return [scored(batch) for batch in raw[:count]]


def hf_logits(model_spec: ModelSpec, batch: dict[str, np.ndarray]) -> np.ndarray:
    """HF's own `*ForTokenClassification` with the core's parameters, in eval mode: logits [B, L, T]."""
    settings = {k: v for k, v in model_spec.hf_config.items() if k not in ("architectures", "transformers_version")}
    config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings, num_labels=len(TAGS))
    reference = transformers.AutoModelForTokenClassification.from_config(config).eval()
    reference.load_state_dict({name: torch.from_numpy(np.asarray(array)) for name, array in model_spec.params.items()},
                              strict=True)
    inputs = {key: torch.from_numpy(np.asarray(batch[key])).long() for key in ("input_ids", "attention_mask")}
    if model_spec.hf_config.get("model_type") in ("bert", "albert", "electra"):
        inputs["token_type_ids"] = torch.from_numpy(batch["token_type_ids"]).long()
    with torch.no_grad():
        return reference(**inputs).logits.numpy()


def check_logits_match_hf(backend, directory: Path) -> None:
    """Every position's logits equal HF's to 1e-4."""
    model_spec, batch = spec(directory), batches(directory, 4, 1)[0]
    logits = backend.predict(backend.init(model_spec, OptimizerSpec()), batch)
    assert logits.shape == (*batch["input_ids"].shape, len(TAGS))
    np.testing.assert_allclose(logits, hf_logits(model_spec, batch), atol=1e-4, rtol=0)


def check_training_follows_torch(backend, directory: Path) -> None:
    """20 steps, dropout off: the torch backend's losses to 1e-3 (relative); the model learns; the parameters are
    the family's under HF names, with the classifier sized for the tags."""
    params = follows_torch(backend, spec(directory), batches(directory, 8, 20))
    assert params["classifier.weight"].shape[0] == len(TAGS)

"""Helpers for the family tests of every backend session: batches tokenized by each family's own tokenizer,
HF transformers' logits, and training losses. The checkpoints come from `tpuplex_torch.testing`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import transformers

import torch
from tpuplex.checkpoints import read_hf_config
from tpuplex.config import RuntimeConfig
from tpuplex.data.batching import Batcher, Encoded
from tpuplex.data.tokenize import load_tokenizer
from tpuplex.kinds.text import expected_shapes
from tpuplex.models import family_of
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex.tasks.sequence_classification.features import encode
from tpuplex.tasks.sequence_classification.glue.files import Examples
from tpuplex.testing.specs import classifier_spec
from tpuplex_torch.backend import TorchBackend
from tpuplex_torch.testing import FAMILIES, SENTENCES, write_checkpoint

HEADS_TRAINED_FAST = ("bert", *(pytest.param(family, marks=pytest.mark.long)
                                for family in FAMILIES if family != "bert"))
"""`family_dir`'s families for the masked-LM and token-classification training checks on jax and tf: BERT in the
fast tier, the other four in the long tier. The fast tier still trains every family under the classification
head (test_families) and meets HF's logits with every family's heads; the encoder and the heads are one forward
pass for every family (`tpuplex.models.encoder`, each task's `Head.forward`), so the other pairs take no other path."""

__all__ = ["FAMILIES", "HEADS_TRAINED_FAST", "check_logits_match_hf",
           "check_parameter_names", "check_training_follows_torch", "eval_batch",
           "follows_torch", "hf_logits", "model_spec", "train", "train_batches", "train_losses", "write_checkpoint"]


def model_spec(directory: Path, num_labels: int = 2, seed: int = 0) -> ModelSpec:
    """The core's initial parameters for the checkpoint, dropout off."""
    hf_config = read_hf_config(directory)
    return classifier_spec(directory, hf_config, num_labels, seed, dropout=False, checkpoint_dir=directory)


def encoded_pairs(directory: Path, rows: int, max_length: int = 24, num_labels: int = 2, seed: int = 0) -> Encoded:
    """Sentence pairs tokenized by the checkpoint's own tokenizer through the core's GLUE encoder; the label is a
    function of the first sentence, so a few steps can learn it."""
    rng = np.random.default_rng(seed)
    first, second = rng.integers(0, len(SENTENCES), (2, rows))
    labels = ((first / len(SENTENCES)).astype(np.float32) if num_labels == 1
              else (first % num_labels).astype(np.int32))
    examples = Examples(text_a=[SENTENCES[i] for i in first], text_b=[SENTENCES[i] for i in second], labels=labels)
    return encode(examples, load_tokenizer(directory, max_length), max_length)


def eval_batch(directory: Path, rows: int = 6, **kwargs) -> dict[str, np.ndarray]:
    """One evaluation batch with right padding of different lengths and a weight-0 padding row."""
    return next(Batcher(encoded_pairs(directory, rows - 1, **kwargs), rows, 1).eval_batches()).batch


def train_batches(directory: Path, global_batch: int, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """`count` training batches of the core's Batcher, lengths bucketed to 16 and 24."""
    data = encoded_pairs(directory, global_batch * count, seed=seed)
    batches = []
    epoch = 0
    while len(batches) < count:
        batches += Batcher(data, global_batch, 1, buckets=(16,), seed=seed).train_batches(epoch)
        epoch += 1
    return batches[:count]


def hf_logits(spec: ModelSpec, batch: dict[str, np.ndarray]) -> np.ndarray:
    """HF's own `*ForSequenceClassification` with the core's parameters loaded strictly (a missing or extra name
    fails), in eval mode, on the batch's ids and 0/1 mask; token types only where the family feeds them."""
    settings = {k: v for k, v in spec.hf_config.items() if k not in ("architectures", "transformers_version")}
    config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings, num_labels=spec.num_labels)
    reference = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    weights = {name: torch.from_numpy(np.asarray(array)) for name, array in spec.params.items()}
    reference.load_state_dict(weights, strict=True)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if family_of(spec.hf_config).architecture(spec.hf_config).token_types:
        inputs["token_type_ids"] = batch["token_type_ids"]
    with torch.no_grad():
        return reference(**{k: torch.from_numpy(np.asarray(v)).long() for k, v in inputs.items()}).logits.numpy()


def train(backend, spec: ModelSpec, batches: list[dict[str, np.ndarray]], peak: float = 1e-3
          ) -> tuple[list[float], Any]:
    """The losses of `len(batches)` optimizer steps from the core's initial state (linear warmup over 5 steps),
    and the state they end in."""
    state = backend.init(spec, OptimizerSpec())
    losses = []
    for index, batch in enumerate(batches):
        state, loss = backend.train_step(state, batch, peak * min(1.0, (index + 1) / 5))
        losses.append(loss)
    return losses, state


def train_losses(backend, spec: ModelSpec, batches: list[dict[str, np.ndarray]], peak: float = 1e-3) -> list[float]:
    return train(backend, spec, batches, peak)[0]


def follows_torch(backend, spec: ModelSpec, batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Train `backend` and the torch backend from `spec` on `batches`: the losses agree to 1e-3 (relative), the
    model learns, and the backend's parameters are the family's HF names and shapes (`expected_shapes`), which it
    returns."""
    expected = train_losses(TorchBackend(RuntimeConfig()), spec, batches)
    losses, state = train(backend, spec, batches)
    np.testing.assert_allclose(losses, expected, rtol=1e-3)
    assert np.mean(expected[-5:]) < np.mean(expected[:5])
    params = backend.state_to_arrays(state).params
    assert {name: array.shape for name, array in params.items()} == expected_shapes(spec.hf_config, spec.head)
    return params


# --- the checks each backend session runs on every family --------------------------------------------------------


def check_logits_match_hf(backend, directory: Path, num_labels: int) -> None:
    """The backend's logits of a fresh init equal HF transformers' to 1e-4 (absolute)."""
    spec = model_spec(directory, num_labels=num_labels)
    batch = eval_batch(directory, num_labels=num_labels)
    logits = backend.predict(backend.init(spec, OptimizerSpec()), batch)
    assert logits.shape == (len(batch["input_ids"]), num_labels)
    np.testing.assert_allclose(logits, hf_logits(spec, batch), atol=1e-4, rtol=0)


def check_training_follows_torch(backend, directory: Path) -> None:
    """20 steps, dropout off, give the torch backend's losses to 1e-3 (relative), and really train."""
    follows_torch(backend, model_spec(directory), train_batches(directory, global_batch=8, count=20))


def check_parameter_names(backend, directory: Path) -> None:
    """The backend's portable parameters are exactly the family's HF names and shapes, holding the core's values."""
    spec = model_spec(directory)
    params = backend.state_to_arrays(backend.init(spec, OptimizerSpec())).params
    shapes = expected_shapes(spec.hf_config, spec.head)
    assert {name: array.shape for name, array in params.items()} == shapes
    assert all(np.array_equal(params[name], spec.params[name]) for name in shapes)

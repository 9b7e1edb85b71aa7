"""The masked-LM checks every backend session runs on every family: per-token losses equal HF transformers'
`*ForMaskedLM` (torch), training with the core's masks follows the torch backend, and the decoder stays tied to the
word embeddings (one parameter, under the family's HF names)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch.nn.functional as F
import transformers
from hf_families import follows_torch

import torch
from tpuplex.checkpoints import read_hf_config
from tpuplex.data.batching import Batcher
from tpuplex.data.tokenize import load_tokenizer
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex.tasks.masked_lm import data as text
from tpuplex.testing.specs import masked_lm_spec
from tpuplex_torch.testing import SENTENCES

MAX_LENGTH = 16


def spec(directory: Path) -> ModelSpec:
    return masked_lm_spec(directory, read_hf_config(directory), dropout=False, checkpoint_dir=directory)


def packed_batches(directory: Path, global_batch: int, count: int) -> list[dict[str, np.ndarray]]:
    """`count` training batches of the tiny corpus packed into rows of MAX_LENGTH, not masked yet."""
    tokenizer = text.untruncated_tokenizer(directory, MAX_LENGTH)
    packed = text.encode_packed(list(SENTENCES) * 8, tokenizer, MAX_LENGTH, "the tiny corpus")
    raw, epoch = [], 0
    while len(raw) < count:
        raw += Batcher(packed, global_batch, 1, seed=0).train_batches(epoch)
        epoch += 1
    return raw[:count]


def batches(directory: Path, global_batch: int, count: int, probability: float = 0.3) -> list[dict[str, np.ndarray]]:
    """`count` packed batches of the tiny corpus, masks drawn per step."""
    tokenizer = text.untruncated_tokenizer(directory, MAX_LENGTH)
    mask, special = text.mask_id(tokenizer, directory), text.special_ids(tokenizer)
    vocab = load_tokenizer(directory, MAX_LENGTH).get_vocab_size(with_added_tokens=True)
    return [{**batch, **text.mask_tokens(batch["input_ids"], batch["attention_mask"], batch["weight"],
                                         np.random.default_rng([0, step]), probability, mask, vocab, special)}
            for step, batch in enumerate(packed_batches(directory, global_batch, count), start=1)]


def every_position(batch: dict[str, np.ndarray], original_ids: np.ndarray) -> dict[str, np.ndarray]:
    """A masked batch with the head run on every position [B, L], each labelled with its original id."""
    rows, length = original_ids.shape
    return {**batch, "masked_positions": np.tile(np.arange(length, dtype=np.int32), (rows, 1)),
            "labels": original_ids, "weight": np.ones((rows, length), np.float32)}


def hf_token_losses(model_spec: ModelSpec, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """HF's own `*ForMaskedLM` with the core's parameters (tied decoder): per-token cross-entropy [B, L] and
    argmax [B, L], in eval mode."""
    settings = {k: v for k, v in model_spec.hf_config.items() if k not in ("architectures", "transformers_version")}
    config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings)
    reference = transformers.AutoModelForMaskedLM.from_config(config).eval()
    state = {name: torch.from_numpy(np.asarray(array)) for name, array in model_spec.params.items()}
    tied = reference._tied_weights_keys or {}
    reference.load_state_dict(state | {alias: state[target] for alias, target in tied.items()}, strict=True)
    inputs = {key: torch.from_numpy(np.asarray(batch[key])).long() for key in ("input_ids", "attention_mask")}
    if model_spec.hf_config.get("model_type") in ("bert", "albert", "electra"):
        inputs["token_type_ids"] = torch.from_numpy(batch["token_type_ids"]).long()
    with torch.no_grad():
        logits = reference(**inputs).logits
    labels = torch.from_numpy(batch["labels"]).long()
    losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    return losses.view(labels.shape).numpy(), logits.argmax(-1).numpy()


def check_token_losses_match_hf(backend, directory: Path) -> None:
    """Per-token cross-entropy (every position, a function of all V logits) equals HF's to 1e-4, and the most
    likely token is HF's; on the masked positions alone the head gives the same values."""
    model_spec, masked = spec(directory), batches(directory, 4, 1)[0]
    state = backend.init(model_spec, OptimizerSpec())
    batch = every_position(masked, packed_batches(directory, 4, 1)[0]["input_ids"])
    outputs = backend.predict(state, batch)
    losses, best = hf_token_losses(model_spec, batch)
    assert outputs.shape == (*batch["input_ids"].shape, 2)
    np.testing.assert_allclose(outputs[..., 0], losses, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(outputs[..., 1], (best == batch["labels"]).astype(np.float32))
    at_masks = backend.predict(state, masked)
    expected = np.take_along_axis(outputs, masked["masked_positions"][..., None], axis=1)
    assert at_masks.shape == (*masked["labels"].shape, 2)
    np.testing.assert_allclose(at_masks[..., 0], expected[..., 0], atol=1e-5, rtol=0)


def check_training_follows_torch(backend, directory: Path) -> None:
    """20 steps on the same masks, dropout off: the torch backend's losses to 1e-3 (relative); the model learns;
    the decoder stays the word embeddings (no decoder parameter of its own)."""
    params = follows_torch(backend, spec(directory), batches(directory, 8, 20))
    assert not any("decoder.weight" in name or name.endswith(("lm_head.weight", "vocab_projector.weight"))
                   for name in params)

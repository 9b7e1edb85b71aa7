"""The tests every backend session runs on T5 at a small size: logits against transformers'
`T5ForConditionalGeneration` (v1.0 and v1.1 configs drawn by `T5Config`), 20 training steps against the torch
backend, and greedy and beam-search decoding against transformers' `generate`. A session's test_t5.py imports them
and gives the `backend` fixture."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import transformers

import torch
from tpuplex import models
from tpuplex.config import RuntimeConfig
from tpuplex.kinds.encoder_decoder import EncoderDecoders
from tpuplex.models import t5
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts
from tpuplex.tasks.seq2seq import TASK
from tpuplex_torch.backend import TorchBackend

VOCAB = 40
_SMALL = {"model_type": "t5", "vocab_size": VOCAB, "d_model": 32, "d_kv": 8, "d_ff": 48, "num_layers": 2,
          "num_heads": 4, "relative_attention_num_buckets": 8, "relative_attention_max_distance": 12,
          "dropout_rate": 0.0, "decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1}
"""Buckets and a maximal distance that rows of 16 go past, so the logarithmic buckets are read too."""
CONFIGS = {
    "v1.0": {**_SMALL, "feed_forward_proj": "relu", "num_decoder_layers": 3},
    "v1.1": {**_SMALL, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
}
"""v1.0: ReLU, tied and scaled head (three decoder layers to two encoder ones); v1.1: gated GELU, untied (which
transformers 5 reads as its `scale_decoder_outputs = False`)."""


def t5_spec(folder: Path, config: dict, seed: int = 3) -> ModelSpec:
    """T5 of config.json `config` drawn from scratch (that file alone in `folder`), dropout off."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    family, arch = models.architecture_of(config)
    kind = EncoderDecoders(folder, config, family, arch)
    return ModelSpec(kind=kind, task=TASK, inputs=TASK.inputs, head=TASK.head(family, arch, {}, None),
                     hf_config=config, family=family, arch=arch, params=kind.initial_state(None, seed)[0],
                     dropout=False, checkpoint_dir=folder)


def tied_like_transformers(spec: ModelSpec) -> ModelSpec:
    """`spec` with an untied LM head set to the word embeddings: transformers 5 always ties T5's head (its config
    turns `tie_word_embeddings = False` into `scale_decoder_outputs = False`), so an untied v1.1 is compared with
    it through the same head."""
    if spec.arch.tied:
        return spec
    params = {**spec.params, "lm_head.weight": np.array(spec.params["shared.weight"])}
    return dataclasses.replace(spec, params=params)


def hf_reference(spec: ModelSpec) -> torch.nn.Module:
    """transformers' T5ForConditionalGeneration with the core's parameters (a `tied_like_transformers` spec),
    loaded strictly, eval mode."""
    settings = dict(spec.hf_config)
    config = transformers.T5Config(**{key: value for key, value in settings.items() if key != "model_type"})
    model = transformers.T5ForConditionalGeneration(config).eval()
    state = {name: torch.from_numpy(np.asarray(array)) for name, array in spec.params.items()}
    aliases = {alias: state[target] for alias, target in spec.family.tied_names(spec.arch).items()
               if alias in model.state_dict()}
    model.load_state_dict(state | aliases, strict=True)
    return model


def text_batch(rows: int = 6, source: int = 16, target: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs (some rows padded) and targets, teacher-forced."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, VOCAB, (rows, source)).astype(np.int32)
    mask = (np.arange(source)[None, :] < rng.integers(4, source + 1, rows)[:, None]).astype(np.int32)
    labels = rng.integers(2, VOCAB, (rows, target)).astype(np.int32)
    return {"input_ids": ids * mask, "attention_mask": mask, "decoder_input_ids": t5.shift_right(labels, 0),
            "labels": labels, "weight": np.ones((rows, target), np.float32)}


@pytest.mark.parametrize("version", CONFIGS)
def test_logits_match_transformers(backend, tmp_path: Path, version: str) -> None:
    """Every target token's loss equals the cross-entropy of transformers' logits to 1e-4, and so does the
    predicted token."""
    spec = tied_like_transformers(t5_spec(tmp_path, CONFIGS[version]))
    batch = text_batch()
    with torch.no_grad():
        logits = hf_reference(spec)(**{name: torch.from_numpy(batch[name]).long() for name in TASK.inputs}).logits
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), torch.from_numpy(batch["labels"]).long()
                                               .reshape(-1), reduction="none").reshape(batch["labels"].shape)
    outputs = backend.predict(backend.init(spec, OptimizerSpec()), batch)
    np.testing.assert_allclose(outputs[..., 0], losses.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_array_equal(outputs[..., 1], (logits.argmax(-1).numpy() == batch["labels"]))


def twenty_steps(backend, spec: ModelSpec) -> list[float]:
    state, found = backend.init(spec, OptimizerSpec(weight_decay=0.1)), []
    for index in range(20):
        state, loss = backend.train_step(state, text_batch(seed=index % 4), 3e-3 * min(1.0, (index + 1) / 5))
        found.append(loss)
    return found


def test_training_follows_torch(backend, tmp_path: Path) -> None:
    """20 dropout-off steps of v1.1 give the torch backend's losses to 1e-4 (relative), and really train."""
    spec = t5_spec(tmp_path, CONFIGS["v1.1"])
    expected = twenty_steps(TorchBackend(RuntimeConfig()), spec)
    np.testing.assert_allclose(twenty_steps(backend, spec), expected, rtol=1e-4)
    assert np.mean(expected[-4:]) < np.mean(expected[:4]) - 0.1


def test_generation_matches_transformers(backend, tmp_path: Path) -> None:
    """Greedy decoding and beam search of 4 beams, 20 tokens, equal transformers' `generate` up to each row's
    end-of-text (transformers fills a finished beam with end-of-text where tpuplex pads). The model is drawn with
    large weights so that its 12 tokens are not one token's repetition (and as many decoder layers as encoder ones:
    transformers' cache sizes itself by the encoder's)."""
    spec = tied_like_transformers(t5_spec(tmp_path, {**CONFIGS["v1.1"], "vocab_size": 12, "initializer_factor": 4.0}))
    reference, state = hf_reference(spec), backend.init(spec, OptimizerSpec())
    ids = np.random.default_rng(2).integers(2, 12, (3, 9)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    for beams in (1, 4):
        with torch.no_grad():
            expected = reference.generate(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(
                mask).long(), max_new_tokens=20, num_beams=beams, do_sample=False)[:, 1:].numpy()
        found = backend.generate(state, Prompts(ids * mask, mask, 20, 0.0, 0, np.zeros((3, 20), np.float32),
                                                beams=beams))
        assert found.shape == (3, 20)
        for row, want in zip(found, expected, strict=True):
            end = int(np.argmax(want == 1)) + 1 if (want == 1).any() else len(want)
            np.testing.assert_array_equal(row[:end], want[:end])
            assert (row[end:] == 0).all()
        assert len({tuple(row) for row in found}) > 1

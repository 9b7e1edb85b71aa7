"""Every rope type transformers has, in every rotary family, against transformers itself: a tiny checkpoint drawn
and saved by transformers with that rope table, read by tpuplex, gives transformers' per-token losses (1e-4) at a
length below and one above the table's original length, and transformers' greedy tokens (with the key/value cache)
for prompts below it, above it, and crossing it while decoding. A session's test_rope.py imports the test with the
backend fixture, and runs `check_rope_checkpoint` over `CASES` (torch) or `SUBSET` (jax, tf)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import transformers
from decoder_checks import CONFIGS, VOCAB

import torch
from tpuplex import models
from tpuplex.kinds.decoder import Decoders
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts
from tpuplex.tasks.causal_lm import TASK

ORIGINAL = 16
"""Every table's original length (dynamic's: max_position_embeddings); the checkpoints take 64 positions."""
BELOW, ABOVE = 12, 40
FACTORS = {8: ([1.0, 1.2, 1.5, 2.0], [1.0, 2.5, 4.0, 6.0]),
           12: ([1.0, 1.1, 1.3, 1.6, 2.0, 2.4], [1.0, 1.5, 2.5, 4.0, 6.0, 8.0])}
"""longrope's short and long factors per head size (Mistral and Gemma 2 heads are 12 wide here, the rest 8)."""
TABLES = {
    "default": {"rope_type": "default", "rope_theta": 500.0},
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 500.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL, "rope_theta": 500.0,
             "beta_fast": 8.0},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": ORIGINAL, "rope_theta": 500.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIGINAL, "rope_theta": 500.0},
}
ROTARY_FAMILIES = ("llama", "qwen2", "mistral", "gemma2", "phi3")
PHI3_TYPES = ("default", "longrope")
"""The rope types transformers builds Phi-3 with (it refuses the others, and so does tpuplex)."""
CASES = [(family, kind) for family in ROTARY_FAMILIES for kind in TABLES
         if family != "phi3" or kind in PHI3_TYPES] + [("llama-legacy", kind) for kind in TABLES] + [
    ("phi3-partial", kind) for kind in PHI3_TYPES]
"""Every family with every rope type it takes, Llama's tables under the legacy `rope_scaling` key, and Phi-3
rotating half of each head (`partial_rotary_factor`, Phi-4-mini's 0.75 in kind)."""
SUBSET = [("llama", "yarn"), ("llama", "llama3"), ("llama", "longrope"), ("phi3-partial", "longrope"),
          ("gemma2", "dynamic"), ("qwen2", "linear")]
"""What the jax and tf sessions run (13 s a case on tf): every type but the default once (whose constant table
the decoder tests check on every family), in four families. The fast tier splits them between the two sessions
(`FAST`), so every type runs on one of them; the long tier runs the rest."""
FAST = {"jax": [("llama", "yarn"), ("llama", "longrope"), ("gemma2", "dynamic")],
        "tf": [("llama", "llama3"), ("phi3-partial", "longrope"), ("qwen2", "linear")]}


def rope_table(family: str, kind: str) -> dict:
    table = dict(TABLES[kind])
    if kind == "longrope":
        short, long = FACTORS[CONFIGS[family].get("head_dim", 8)]
        table |= {"short_factor": short, "long_factor": long}
    return table


def model_settings(family: str) -> tuple[str, dict]:
    """The model_type and the config of `family`, one of CASES' (the decoder tests' tiny sizes)."""
    if family == "phi3-partial":
        return "phi3", {**CONFIGS["phi3"], "partial_rotary_factor": 0.5}
    model_type = "llama" if family == "llama-legacy" else family
    return model_type, CONFIGS[model_type]


def write_rope_checkpoint(folder: Path, family: str, kind: str) -> Path:
    """A tiny `family` model with the rope table `kind`, drawn by transformers (noise on its initialisation, so that
    the positions show in the losses) and saved with `save_pretrained`; "llama-legacy" rewrites Llama's config.json
    into the legacy form (`rope_scaling` with `type`, `rope_theta` beside it)."""
    model_type, settings = model_settings(family)
    settings = {key: value for key, value in settings.items() if key != "model_type"}
    settings["max_position_embeddings"] = ORIGINAL if kind == "dynamic" else 64
    if model_type == "phi3":
        settings["original_max_position_embeddings"] = ORIGINAL
    table = rope_table(model_type, kind)
    if kind == "longrope" and family == "phi3-partial":  # a factor per rotated frequency: half as many
        table |= {key: table[key][::2] for key in ("short_factor", "long_factor")}
    config = transformers.AutoConfig.for_model(model_type, **settings, rope_parameters=table)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    if family == "llama-legacy":
        saved = json.loads((folder / "config.json").read_text())
        table = saved.pop("rope_parameters")
        legacy = {("type" if key == "rope_type" else key): value for key, value in table.items()
                  if key != "rope_theta"}
        (folder / "config.json").write_text(json.dumps(saved | {"rope_scaling": legacy,
                                                                "rope_theta": table["rope_theta"]}))
    return folder


def checkpoint_spec(folder: Path, seed: int = 0) -> ModelSpec:
    """The causal-LM spec of the checkpoint in `folder` as `tpuplex train` builds it (the kind's reading of the
    weights may untie the head: its arch and config.json are taken after)."""
    config = json.loads((folder / "config.json").read_text())
    family, arch = models.architecture_of(config)
    kind = Decoders(folder, config, family, arch)
    return ModelSpec(kind=kind, task=TASK, inputs=TASK.inputs, head=TASK.head(family, kind.arch, {}, None),
                     hf_config=kind.hf_config, family=family, arch=kind.arch,
                     params=kind.initial_state(None, seed)[0], dropout=False, checkpoint_dir=folder)


def reference(folder: Path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def reference_losses(model: torch.nn.Module, batch: dict[str, np.ndarray]) -> np.ndarray:
    """transformers' per-token cross-entropy of the batch's labels."""
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(batch["input_ids"]).long()).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.from_numpy(batch["labels"]).long()
                                             .flatten(), reduction="none").reshape(batch["labels"].shape).numpy()


def rows(length: int, count: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed + length).integers(0, VOCAB, (count, length + 1)).astype(np.int32)
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "weight": np.ones((count, length), np.float32)}


def check_rope_checkpoint(backend, tmp_path: Path, family: str, kind: str) -> None:
    """A transformers-drawn checkpoint with the rope table `kind`: the same per-token losses at a length below and
    one above the original length (1e-4), the same greedy tokens with the cache from prompts below, above and
    across it."""
    folder = write_rope_checkpoint(tmp_path, family, kind)
    spec = checkpoint_spec(folder)
    expected = "default" if kind == "default" else kind
    assert spec.arch.rope.kind == expected
    theirs = reference(folder)
    state = backend.init(spec, OptimizerSpec())
    for length in (BELOW, ABOVE):
        batch = rows(length)
        np.testing.assert_allclose(backend.predict(state, batch)[..., 0], reference_losses(theirs, batch),
                                   atol=1e-4, rtol=0, err_msg=f"length {length}")
    # Phi-3's generate drops its cache to recompute the sequence with the long factors where decoding crosses
    # original_max_position_embeddings; tpuplex keeps its cache (tpuplex.models.rope), so that crossing is not asked.
    crossing = not (family.startswith("phi3") and kind == "longrope")
    for prompt_length, new in ((6, 6), (ABOVE - 8, 6), *([(ORIGINAL - 3, 6)] if crossing else [])):
        prompts = rows(prompt_length, seed=7)["input_ids"]
        with torch.no_grad():
            expected_tokens = theirs.generate(torch.from_numpy(prompts).long(), max_new_tokens=new,
                                              do_sample=False)[:, prompt_length:].numpy()
        found = backend.generate(state, Prompts(prompts, np.ones_like(prompts), new, 0.0, 0,
                                                np.zeros((len(prompts), new), np.float32)))
        np.testing.assert_array_equal(found, expected_tokens, err_msg=f"prompt {prompt_length}")


def parametrize(cases, fast=None):
    """`cases` as (family, kind) parameters; those outside `fast` (when given) in the long tier."""
    return pytest.mark.parametrize(("family", "kind"), [
        pytest.param(family, kind, id=f"{family}-{kind}",
                     marks=() if fast is None or (family, kind) in fast else pytest.mark.long)
        for family, kind in cases])

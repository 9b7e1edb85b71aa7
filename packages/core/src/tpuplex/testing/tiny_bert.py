"""A small random BERT checkpoint directory, written with numpy and safetensors, for fast tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tpuplex.kinds.text import expected_shapes
from tpuplex.testing.specs import classifier

TINY_CONFIG = {
    "model_type": "bert",
    "architectures": ["BertModel"],
    "vocab_size": 128,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-12,
    "pad_token_id": 0,
}


def write_tiny_bert(directory: str | Path, seed: int = 0, **overrides) -> Path:
    """Write `config.json` and `model.safetensors` (BertModel names, no head) with N(0, 0.02) weights.

    LayerNorm weights are drawn around 1 so the test exercises them; `overrides` change config fields.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {**TINY_CONFIG, **overrides}
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in expected_shapes(config, classifier(config, 1)).items():
        if name.startswith("classifier."):
            continue
        scale = 0.02 if name.endswith("weight") and "LayerNorm" not in name else 0.1
        center = 1.0 if "LayerNorm.weight" in name else 0.0
        weights[name.removeprefix("bert.")] = (center + scale * rng.standard_normal(shape)).astype(np.float32)
    save_file(weights, directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory

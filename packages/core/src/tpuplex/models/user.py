"""Your own model, named in the config and trained by tpuplex: a network written once over the op table (a
`tpuplex.nn.Network`, the same class on every backend), or a classifier written in the backend's framework.

    [model]
    architecture = "my_pkg.models:TextCNN"              # a tpuplex.nn.Network: one path for every backend

or, a module per framework:

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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuplex.errors import TpuplexError
from tpuplex.plugins import add_search_path, check_import_path, import_object


def resolve(architecture: str, backend: str) -> Any:
    """The object `module:attribute` names for `backend`, imported now; one clear error naming it on failure."""
    check_import_path(architecture)
    add_search_path(Path.cwd())
    found = import_object(architecture.replace("{backend}", backend), f"model.architecture = {architecture!r}")
    if not callable(found):
        raise TpuplexError(f"model.architecture = {architecture!r} is a {type(found).__name__}, not a class or "
                           "function: name the model's class")
    return found


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

"""Typed reading of an HF `config.json`, shared by every family: one-line errors that name the file, the key and
the fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuplex.errors import TpuplexError

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "tanh")
"""Activation names (HF's spelling) every backend implements; "gelu" is the exact erf form."""

_REQUIRED = object()
MAX_LAYERS = 10_000
"""The most layers a config.json may ask for: 100x the deepest published models, far past anything one builds."""
_DROPOUT = re.compile(r"dropout|pdrop")
"""config.json keys that hold a dropout rate (`hidden_dropout_prob`, GPT-2's `resid_pdrop`, ...)."""


class ConfigReader:
    """Typed access to an HF `config.json` whose errors name the file, the key and the fix."""

    def __init__(self, config: Mapping[str, Any], path: Path | str):
        self.config, self.path = config, path

    def get(self, key: str, kind: type, default: Any = _REQUIRED) -> Any:
        value = self.config.get(key, default)
        if value is _REQUIRED:
            raise TpuplexError(f"{self.path} lacks {key!r}: the checkpoint's config.json must be a complete HF "
                               "config (save it with model.config.save_pretrained)")
        if value is None and default is None:
            return None
        accepted = (int, float) if kind is float else (kind,)
        if isinstance(value, accepted) and (kind is bool or not isinstance(value, bool)):
            if kind is float and not math.isfinite(value):
                raise TpuplexError(f"{key} = {value!r} in {self.path} is not a finite number: fix the checkpoint's "
                                   "config.json")
            if kind is float and _DROPOUT.search(key) and not 0 <= value <= 1:
                raise TpuplexError(f"{key} = {value!r} in {self.path} is a dropout rate, which must be in [0, 1]: fix "
                                   "the checkpoint's config.json")
            if kind is float and value < 0:  # every rate, epsilon, scale and theta a family reads
                raise TpuplexError(f"{key} = {value!r} in {self.path} is negative: fix the checkpoint's config.json")
            return kind(value)
        raise TpuplexError(f"{key} = {value!r} in {self.path} is not a{'n' if kind is int else ''} "
                           f"{kind.__name__}: fix the checkpoint's config.json")

    def activation(self, key: str, default: str) -> str:
        name = self.get(key, str, default)
        if name not in ACTIVATIONS:
            raise TpuplexError(f"{key} = {name!r} in {self.path} is not supported: tpuplex implements "
                               f"{', '.join(ACTIVATIONS)}")
        return name

    def positive(self, key: str, default: Any = _REQUIRED) -> int | None:
        """A positive integer (None where it is absent and the default is None)."""
        value = self.get(key, int, default)
        if value is not None and value <= 0:
            raise TpuplexError(f"{key} = {value} in {self.path} must be positive: fix the checkpoint's config.json")
        return value

    def layers(self, key: str, default: Any = _REQUIRED) -> int:
        """A count of layers (or of layer groups): positive and at most MAX_LAYERS, since every layer is built and
        applied one by one."""
        value = self.positive(key, default)
        if value > MAX_LAYERS:
            raise TpuplexError(f"{key} = {value} in {self.path} is more layers than tpuplex builds (at most "
                               f"{MAX_LAYERS:,}): fix the checkpoint's config.json")
        return value

    def absolute_positions(self) -> None:
        kind = self.get("position_embedding_type", str, "absolute")
        if kind != "absolute":
            raise TpuplexError(f"position_embedding_type = {kind!r} in {self.path} is not supported: tpuplex "
                               "builds encoders with absolute position embeddings")

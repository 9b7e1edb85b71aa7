"""Speech families (`tpuplex.models.conformer`: a Conformer for CTC), whose forward pass is written once over each
framework's operations (each backend's `kinds/speech.py` holds the parameters).

A config.json alone is a model to train from scratch, drawn by the core; a `model.safetensors` beside it (a
checkpoint of the same sizes, e.g. `tpuplex export` of an earlier run's parameters) is read instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex import models
from tpuplex.errors import TpuplexError
from tpuplex.kinds import ModelKind, backend_modules
from tpuplex.models.conformer import initial_params, parameter_shapes
from tpuplex.models.weights import PICKLE, SAFETENSORS, load_weights
from tpuplex.params import check_names


class SpeechFamilies(ModelKind):
    name: ClassVar[str] = "speech"
    families: ClassVar[tuple[Any, ...]] = models.SPEECH_FAMILIES
    frameworks: ClassVar[dict[str, str]] = backend_modules("speech", "SpeechFamily")

    def initial_state(self, head: Any, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The parameters for the data's mel bins and vocabulary (`head`): the folder's weights, else drawn."""
        shapes = parameter_shapes(self.arch, head.mel_bins, head.vocab_size)
        folder = Path(self.checkpoint_dir)
        if not any((folder / name).is_file() for name in (SAFETENSORS, PICKLE)):
            return initial_params(self.arch, head.mel_bins, head.vocab_size, seed), {}
        loaded = load_weights(folder)
        check_names(shapes, loaded, f"the weights in {folder}")
        return {name: loaded[name] for name in shapes}, {}

    def forward_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        rows, frames, mel = np.shape(batch["features"])
        return self.arch.forward_flops(rows, frames, mel, spec.head.vocab_size)

    def hf_class(self, config: Any, task: Any) -> str:
        raise TpuplexError("a Conformer-CTC has no transformers class: export it with --format saved_model or "
                           "torch_export")

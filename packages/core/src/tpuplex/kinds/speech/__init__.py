"""Speech families (`tpuplex.models.conformer`: a Conformer for CTC), whose forward pass is written once over the
op table: a `tpuplex.nn.Network` (`ConformerNetwork`), which each backend's generic holder runs.

A config.json alone is a model to train from scratch, drawn by the core; a `model.safetensors` beside it (a
checkpoint of the same sizes, e.g. `tpuplex export` of an earlier run's parameters) is read instead.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex import models, nn
from tpuplex.checkpoints import check_names
from tpuplex.errors import TpuplexError
from tpuplex.kinds.base import ModelKind, backend_modules
from tpuplex.models.conformer import ConformerArch, forward, initial_params, parameter_shapes
from tpuplex.models.weights import PICKLE, SAFETENSORS, load_weights
from tpuplex.protocol import ModelSpec


class SpeechFamilies(ModelKind):
    name: ClassVar[str] = "speech"
    families: ClassVar[tuple[Any, ...]] = models.SPEECH_FAMILIES
    frameworks: ClassVar[dict[str, str]] = backend_modules("network", "NetworkModule")

    def initial_state(self, head: Any, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The parameters for the data's mel bins and vocabulary (`head`): the folder's weights, else drawn."""
        shapes = parameter_shapes(self.arch, head.mel_bins, head.vocab_size)
        folder = Path(self.checkpoint_dir)
        if not any((folder / name).is_file() for name in (SAFETENSORS, PICKLE)):
            return nn.initial_params(ConformerNetwork(self.arch, head.mel_bins, head.vocab_size), seed), {}
        loaded = load_weights(folder)
        check_names(shapes, loaded, f"the weights in {folder}")
        return {name: loaded[name] for name in shapes}, {}

    def network(self, spec: ModelSpec) -> nn.Network:
        return ConformerNetwork(spec.arch, spec.head.mel_bins, spec.head.vocab_size)

    def forward_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        rows, frames, mel = np.shape(batch["features"])
        return self.arch.forward_flops(rows, frames, mel, spec.head.vocab_size)

    def hf_class(self, config: Any, task: Any) -> str:
        raise TpuplexError("a Conformer-CTC has no transformers class: export it with --format saved_model or "
                           "torch_export")


class ConformerNetwork(nn.Network):
    """A Conformer for CTC (`tpuplex.models.conformer.forward`): (features float32 [B, T, mel], attention_mask int
    [B, T]) -> (logits [B, T', vocab], output_lengths [B])."""

    def __init__(self, arch: ConformerArch, mel_bins: int, vocab_size: int):
        self.arch, self.mel_bins, self.vocab_size = arch, mel_bins, vocab_size

    def params(self) -> dict[str, nn.Param]:
        """Drawn as HF draws such a model (`tpuplex.models.conformer.initial_params`, once per seed)."""
        drawn = functools.cache(lambda seed: initial_params(self.arch, self.mel_bins, self.vocab_size, seed))
        return {name: nn.Param(shape, lambda seed, name, shape: drawn(seed)[name])
                for name, shape in parameter_shapes(self.arch, self.mel_bins, self.vocab_size).items()}

    def __call__(self, ops: Any, params: Mapping[str, Any], features: Any, attention_mask: Any) -> tuple[Any, Any]:
        lengths = ops.sum(attention_mask, (1,))
        return forward(ops, params, self.arch, features, lengths), self.arch.output_frames(lengths)

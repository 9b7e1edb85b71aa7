"""Text encoder families (`tpuplex.models`: BERT, RoBERTa, DistilBERT, ELECTRA, ALBERT), each described once as
an `Architecture`, built with the task's head in each framework (`tpuplex_<backend>.kinds.text`).

The initial weights are the checkpoint's, with the head's missing parts drawn by the core (`initial_params`), so
every backend starts from the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex import initializers, models
from tpuplex.checkpoints import check_names
from tpuplex.errors import TpuplexError
from tpuplex.kinds.base import ModelKind, backend_modules
from tpuplex.models import encoder_architecture
from tpuplex.models.weights import PICKLE, SAFETENSORS, load_weights
from tpuplex.tasks.base import Head


class TextEncoders(ModelKind):
    name: ClassVar[str] = "text"
    families: ClassVar[tuple[Any, ...]] = models.FAMILIES
    frameworks: ClassVar[dict[str, str]] = backend_modules("text", "TextEncoder")

    def tensor_dims(self) -> dict[str, int]:
        return self.family.tensor_dims(self.arch)

    def check(self, config: Any, task: Any) -> None:
        if config.data.max_length > self.arch.max_length:
            raise TpuplexError(f"data.max_length = {config.data.max_length} is longer than the model's position "
                               f"embeddings cover: use data.max_length <= {self.arch.max_length}")

    def check_data(self, data: Any) -> None:
        """Token ids beyond the embedding table would index out of range deep inside a framework."""
        for split, encoded in data.splits().items():
            largest = encoded.max_token_id
            if largest >= self.arch.vocab_size:
                raise TpuplexError(f"the tokenizer in {self.checkpoint_dir} gives token id {largest} on {split}, but "
                                   f"the model has {self.arch.vocab_size} word embeddings: use the tokenizer saved "
                                   "with this model")

    def initial_state(self, head: Any, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return initial_params(self.checkpoint_dir, self.hf_config, head, seed), {}

    def forward_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        return self.arch.forward_flops(*np.shape(batch["input_ids"]))


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
    family's prefix, other heads are dropped as `from_pretrained` drops them); a folder with config.json alone
    is pre-training from scratch: the encoder is drawn (`tpuplex.models.encoder_architecture.initial_params`). The
    head's missing parts (`head.drawn`; a linear layer also when its shape differs, e.g. another num_labels) are drawn
    too: linear weights from N(0, initializer_range) with zero biases, norms as weight 1 and bias 0, as HF
    initialises them. Every draw is keyed by `seed` and the parameter's name and made a block at a time when a
    backend reads it (`tpuplex.initializers`), so it is the same on every machine, backend and mesh.
    """
    family, arch = models.architecture_of(hf_config, Path(checkpoint_dir) / "config.json")
    shapes = expected_shapes(hf_config, head)
    folder = Path(checkpoint_dir)
    if any((folder / name).is_file() for name in (SAFETENSORS, PICKLE)):
        loaded = load_weights(folder)
    else:
        drawn = encoder_architecture.initial_params(arch, seed)
        loaded = {family.hf_name(name, arch): array for name, array in drawn.items()}
    params = {}
    for name, array in loaded.items():
        full = name if name in shapes else f"{family.prefix}.{name}"
        if full in shapes:
            params[full] = array
    for module, kind in head.drawn:
        names = {leaf: head.hf_name(f"{module}.{leaf}") for leaf in ("weight", "bias")}
        first = names["bias" if kind == "bias" else "weight"]
        if params.get(first) is not None and params[first].shape == shapes[first]:
            continue
        if kind == "linear":
            params[names["weight"]] = initializers.normal(seed, names["weight"], shapes[names["weight"]],
                                                             arch.initializer_range)
        elif kind == "norm":
            params[names["weight"]] = np.ones(shapes[names["weight"]], np.float32)
        params[names["bias"]] = np.zeros(shapes[names["bias"]], np.float32)
    check_names(shapes, params, f"the weights in {checkpoint_dir}")
    return params


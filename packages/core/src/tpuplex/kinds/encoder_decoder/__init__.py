"""Encoder-decoder models (`tpuplex.models.ENCODER_DECODER_FAMILIES`: T5), described once as a `T5Arch` and run by
the forward pass written once (`tpuplex.models.t5`); each backend's `kinds/encoder_decoder.py` holds the parameters and
each framework's decoding loop.

A config.json alone is a model to train from scratch, drawn by the core as HF initialises T5; with weights
(`model.safetensors` or `pytorch_model.bin`), they are read. The model is called with the task's
(input_ids, attention_mask, decoder_input_ids) and gives next-token logits [B, T, V] over the targets.

Every framework module also decodes (`generate`): the inputs [B, S] through the encoder once, each decoder layer's
cross-attention keys and values once, then N tokens from `decoder_start_id` over a self-attention cache of N
positions, in one compiled loop, greedy or sampled as the decoders sample, or by beam search
(`tpuplex.models.beam`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from tpuplex import models
from tpuplex.kinds.base import ModelKind, backend_modules
from tpuplex.kinds.decoder import Decoders, initial_decoder_params
from tpuplex.models import t5
from tpuplex.slices import SliceReader


class EncoderDecoders(ModelKind):
    name: ClassVar[str] = "encoder_decoder"
    families: ClassVar[tuple[Any, ...]] = models.ENCODER_DECODER_FAMILIES
    frameworks: ClassVar[dict[str, str]] = backend_modules("encoder_decoder", "EncoderDecoder")

    def tensor_dims(self) -> dict[str, int]:
        return self.family.tensor_dims(self.arch)

    check_data = Decoders.check_data
    """A config.json without vocab_size takes the run's tokenizer's; token ids beyond the table are refused."""

    def initial_state(self, head: Any, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return initial_decoder_params(self.checkpoint_dir, self.family, self.arch, seed, t5.initial_params), {}

    def forward_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        rows, source = np.shape(batch["input_ids"])
        return self.arch.forward_flops(rows, source, np.shape(batch["decoder_input_ids"])[1])

    def hf_class(self, config: Any, task: Any) -> str:
        return self.family.hf_class

    def hf_weights(self, weights: dict[str, SliceReader]) -> dict[str, SliceReader]:
        return self.family.hf_weights(self.arch, weights)


def parameter_names(spec: Any) -> dict[str, str]:
    """Canonical -> HF name of every parameter the model of `spec` (a `ModelSpec`) builds."""
    return spec.family.hf_names(spec.arch)


def parameter_shapes(spec: Any) -> dict[str, tuple[int, ...]]:
    """HF name -> portable shape of every parameter the model of `spec` builds."""
    return spec.family.hf_shapes(spec.arch)

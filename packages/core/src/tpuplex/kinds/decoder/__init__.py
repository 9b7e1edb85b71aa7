"""Decoder language models (`tpuplex.models.DECODER_FAMILIES`), each described once as a `DecoderArch` and run by
the forward pass written once (`tpuplex.models.decoder.forward`); each backend's `kinds/decoder.py` holds the
parameters and each framework's decoding loop.

A config.json alone is a model to train from scratch, drawn by the core as HF initialises the family; with
weights (`model.safetensors` or `pytorch_model.bin`, a base model's names given the family's prefix), they are read.
The LM head is read as transformers 5 reads it: `tie_word_embeddings = true` with an `lm_head.weight` of other
numbers in the weights is untied, that head used; `tie_word_embeddings = false` with no head in a causal LM's
weights is refused in one line naming it (a base model's folder, which has no head, gets one drawn).

Every framework module also decodes (`generate`): left-padded prompts [B, P] (P a bucket), a key/value cache of
P + N positions, and N new tokens in one compiled loop, sampled by inverse CDF from uniforms the core draws, so the
same seed gives the same tokens on every backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex import models
from tpuplex.checkpoints import check_names
from tpuplex.errors import CheckpointError, TpuplexError
from tpuplex.kinds.base import ModelKind, backend_modules
from tpuplex.models.decoder import initial_params
from tpuplex.models.lora import Lora
from tpuplex.models.weights import PICKLE, SAFETENSORS, load_weights
from tpuplex.slices import SliceReader


class Decoders(ModelKind):
    name: ClassVar[str] = "decoder"
    families: ClassVar[tuple[Any, ...]] = models.DECODER_FAMILIES
    frameworks: ClassVar[dict[str, str]] = backend_modules("decoder", "Decoder")

    def __init__(self, checkpoint_dir: Path | None, hf_config: Mapping[str, Any], family: Any, arch: Any):
        super().__init__(checkpoint_dir, hf_config, family, arch)
        if arch.tied and checkpoint_dir is not None and has_own_head(Path(checkpoint_dir), family):
            self.arch = dataclasses.replace(arch, tied=False)
            self.hf_config = {**hf_config, "tie_word_embeddings": False}

    def tensor_dims(self) -> dict[str, int]:
        return self.family.tensor_dims(self.arch)

    def check(self, config: Any, task: Any) -> None:
        if config.data.max_length > self.arch.max_length:
            raise TpuplexError(f"data.max_length = {config.data.max_length} is longer than the model's context "
                               f"({self.checkpoint_dir / 'config.json'}): use data.max_length <= "
                               f"{self.arch.max_length}")

    def check_data(self, data: Any) -> None:
        """A config.json without `vocab_size` takes the size of the run's tokenizer (`TaskData.vocabulary_size`:
        a character vocabulary's characters, as nanoGPT's meta.pkl counts them, and end-of-text), here and in
        `hf_config`, so an export's config.json has it. Token ids beyond the embedding table would index out of
        range deep inside a framework."""
        if not self.arch.vocab_size:
            size = data.vocabulary_size()
            if not size:
                raise TpuplexError(f"{self.checkpoint_dir / 'config.json'} has no vocab_size and the run's "
                                   "tokenizer gives it none: set vocab_size there")
            self.arch = dataclasses.replace(self.arch, vocab_size=size)
            self.hf_config = {**self.hf_config, "vocab_size": size}
        for split, encoded in data.splits().items():
            if encoded.max_token_id >= self.arch.vocab_size:
                raise TpuplexError(f"the tokenizer gives token id {encoded.max_token_id} on {split}, but the model "
                                   f"has {self.arch.vocab_size} word embeddings: set vocab_size in "
                                   f"{self.checkpoint_dir / 'config.json'} to at least {encoded.max_token_id + 1}")

    def lora(self, config: Any) -> Lora | None:
        return Lora.read(config.model.lora, self.family, self.arch) if config.model.lora else None

    def initial_state(self, head: Any, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return initial_decoder_params(self.checkpoint_dir, self.family, self.arch, seed), {}

    def forward_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        """The decoder with its LM head (at a chat batch's answer targets alone): the causal-LM task has no head of
        its own."""
        targets = np.shape(batch["target_positions"])[1] if "target_positions" in batch else None
        return self.arch.forward_flops(*np.shape(batch["input_ids"]), targets)

    def hf_class(self, config: Any, task: Any) -> str:
        return self.family.hf_class

    def hf_weights(self, weights: dict[str, SliceReader]) -> dict[str, SliceReader]:
        return self.family.hf_weights(self.arch, weights)


HEAD_ROWS = 4096
"""`has_own_head` compares the head with the word embeddings this many rows at a time."""


def has_own_head(checkpoint_dir: Path, family: Any) -> bool:
    """Whether the folder's weights hold an LM head whose numbers differ from the word embeddings': transformers 5
    then does not tie them, whatever `tie_word_embeddings` says, and reads the head."""
    if not any((checkpoint_dir / name).is_file() for name in (SAFETENSORS, PICKLE)):
        return False
    weights = load_weights(checkpoint_dir)
    head, embeddings = (weights.get(family.hf_name(name)) for name in ("lm_head.weight", "embeddings.word.weight"))
    if head is None or embeddings is None or head.shape != embeddings.shape:
        return head is not None
    blocks = ((slice(first, first + HEAD_ROWS),) for first in range(0, head.shape[0], HEAD_ROWS))
    return any(not np.array_equal(head[block], embeddings[block]) for block in blocks)


def initial_decoder_params(checkpoint_dir: Path, family: Any, arch: Any, seed: int,
                           draw: Callable[[Any, int], dict[str, SliceReader]] = initial_params
                           ) -> dict[str, SliceReader]:
    """Every parameter of the model (HF names, HF layout, float32): the folder's weights, or, without a weights
    file, drawn (`draw`: `tpuplex.models.decoder.initial_params`, or T5's, keyed by `seed`, each drawn a block at
    a time when read); an untied LM head a base model's folder lacks is taken from that draw, as `from_pretrained`
    draws it anew, and one a causal LM's weights lack is refused in one line."""
    def drawn() -> dict[str, SliceReader]:
        names = family.hf_names(arch)
        return {names[name]: array for name, array in draw(arch, seed).items()}

    folder = Path(checkpoint_dir)
    if not any((folder / name).is_file() for name in (SAFETENSORS, PICKLE)):
        return drawn()
    shapes = family.hf_shapes(arch)
    prefix = family.hf_name("embeddings.word.weight").split(".", 1)[0]
    tied = family.tied_names(arch)
    loaded, base_model = {}, True
    for name, array in load_weights(folder).items():
        base_model &= name not in shapes and name not in tied
        full = name if name in shapes or name in tied else f"{prefix}.{name}"
        if full in shapes:
            loaded[full] = array
    head = family.hf_name("lm_head.weight")
    if not arch.tied and head not in loaded:
        if not base_model:
            raise CheckpointError(f"the weights in {folder} lack {head}, the LM head that config.json's "
                                  "tie_word_embeddings = false asks for: add it, or set tie_word_embeddings = true "
                                  "to use the word embeddings as the head")
        loaded[head] = drawn()[head]
    check_names(shapes, loaded, f"the weights in {checkpoint_dir}")
    return loaded


def parameter_names(spec: Any) -> dict[str, str]:
    """Canonical -> HF name of every parameter the decoder of `spec` (a `ModelSpec`) builds: the family's, and
    its LoRA adapters' (`tpuplex.models.lora`)."""
    return {**spec.family.hf_names(spec.arch), **(spec.lora.hf_names() if spec.lora else {})}


def parameter_shapes(spec: Any) -> dict[str, tuple[int, ...]]:
    """HF name -> portable shape of every parameter the decoder of `spec` builds."""
    return {**spec.family.hf_shapes(spec.arch), **(spec.lora.shapes(spec.arch) if spec.lora else {})}

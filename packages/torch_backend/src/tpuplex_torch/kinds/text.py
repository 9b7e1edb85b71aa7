"""Text encoder families in PyTorch: the parameters held under their HF names, run by the encoder written once
(`tpuplex.models.encoder.forward`) and the task's head (`tpuplex.tasks.base.Head.forward`) over torch's table of
operations (`tpuplex_torch.ops.TorchOps`).

`EncoderModel` registers every parameter under its family's HF name in the portable layout (a Linear [out, in]),
so `named_parameters()` is a `from_pretrained` state dict (a tied decoder appears once, as the word embeddings);
each parameter block is an `EncoderBlock` module at its HF prefix (`bert.encoder.layer.3`), which FSDP2 gathers as
one unit (ALBERT's shared blocks are called once per layer that applies them).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tpuplex.checkpoints import check_names
from tpuplex.kinds.text import expected_shapes
from tpuplex.models import encoder
from tpuplex.models.encoder_architecture import Architecture
from tpuplex.protocol import ModelSpec, OptimizerSpec, head_inputs
from tpuplex.tasks.base import Head
from tpuplex_torch.kinds import Built, KindModule
from tpuplex_torch.ops import Layer, Slots, TorchOps, add_module_at, common_prefix, read_slots, register_parameters


class EncoderModel(torch.nn.Module):
    """input_ids, token_type_ids, attention_mask int64 [B, L] (and the head's inputs) -> the head's outputs."""

    def __init__(self, arch: Architecture, head: Head, hf_names: Mapping[str, str],
                 shapes: Mapping[str, tuple[int, ...]]):
        """hf_names: canonical -> HF name of every parameter (encoder and head); shapes: HF name -> shape."""
        super().__init__()
        self.arch, self.head = arch, head
        in_block = [{c: hf for c, hf in hf_names.items() if c.startswith(f"block.{index}.")}
                    for index in range(arch.num_blocks)]
        blocks = [EncoderBlock(arch, index) for index in range(arch.num_blocks)]
        for block, names in zip(blocks, in_block, strict=True):
            add_module_at(self, common_prefix(names.values()), block)
        registered = register_parameters(self, {hf_name: shapes[hf_name] for hf_name in hf_names.values()})
        for block, names in zip(blocks, in_block, strict=True):
            block.slots = {canonical: registered[hf_name] for canonical, hf_name in names.items()}
        self.blocks = blocks
        self.slots = {canonical: registered[hf_name] for canonical, hf_name in hf_names.items()
                      if not canonical.startswith("block.")}
        """The parameters outside the blocks (embeddings, the head)."""

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
                **head_inputs: torch.Tensor) -> torch.Tensor:
        ops, p = TorchOps(self.training, input_ids.device), read_slots(self.slots)
        hidden = encoder.forward(ops, p, self.arch, input_ids, token_type_ids, attention_mask,
                                 layer=lambda index, *args: self.blocks[index](*args))
        return self.head.forward(ops, p, hidden, **head_inputs)


class EncoderBlock(Layer):
    """One parameter block (`tpuplex.models.encoder.block`), its parameters registered below it under their HF
    names and read through `slots` when it runs (FSDP2 has gathered them by then)."""

    def __init__(self, arch: Architecture, index: int):
        super().__init__()
        self.arch, self.index = arch, index
        self.slots: Slots = {}

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor, site: int) -> torch.Tensor:
        return encoder.block(TorchOps(self.training, x.device), read_slots(self.slots), self.arch, self.index, x,
                             attention_mask, site)


class TextEncoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        """The family's encoder with the task's head for `spec.params`; mismatched parameters raise TpuplexError
        naming them."""
        arch, head = (spec.arch, spec.head) if spec.dropout else (spec.arch.without_dropout(),
                                                                  spec.head.without_dropout())
        shapes = expected_shapes(spec.hf_config, head)
        check_names(shapes, spec.params, "model.params")
        names = {**spec.family.hf_names(arch), **{name: head.hf_name(name) for name in head.shapes}}
        inputs = spec.inputs

        def forward(model: EncoderModel, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
            return model(*(batch[name] for name in inputs), **head_inputs(batch, inputs))

        return Built(EncoderModel(arch, head, names, shapes), forward, spec.params)

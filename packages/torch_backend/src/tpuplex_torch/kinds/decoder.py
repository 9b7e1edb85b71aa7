"""The decoder families in PyTorch: the parameters held under their HF names, run by the forward pass written once
(`tpuplex.models.decoder.forward`) over torch's table of operations (`tpuplex_torch.ops.TorchOps`).

`DecoderModel` registers every parameter under its family's HF name, in HF's layout, so `named_parameters()` is a
`from_pretrained` state dict and checkpoints are portable as they are; each layer is a `DecoderBlock` module at its
HF prefix (`model.layers.3`), which FSDP2 gathers as one unit. `generate` runs the decoding loop eagerly, one
token per forward, over a key/value cache of P + N positions.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import torch
from tpuplex.checkpoints import check_names
from tpuplex.kinds.decoder import parameter_names, parameter_shapes
from tpuplex.models import decoder
from tpuplex.models.decoder import DecoderArch
from tpuplex.models.lora import Lora
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts, head_inputs
from tpuplex_torch.kinds import Built, KindModule
from tpuplex_torch.ops import Layer, Slots, TorchOps, add_module_at, common_prefix, read_slots, register_parameters


class DecoderModel(torch.nn.Module):
    """input_ids int64 [B, T] -> next-token logits [B, T, V]; with a cache, (logits, the updated cache)
    (`tpuplex.models.decoder.forward`'s arguments)."""

    def __init__(self, arch: DecoderArch, hf_names: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]],
                 lora: Lora | None = None):
        """hf_names: canonical -> HF name of every parameter; shapes: HF name -> shape (HF layout); lora: the
        adapters among them (`tpuplex.models.lora`), or None."""
        super().__init__()
        self.arch, self.lora = arch, lora
        in_block = {index: {c: hf for c, hf in hf_names.items() if c.startswith(f"block.{index}.")}
                    for index in range(arch.num_layers)}
        blocks = [DecoderBlock(arch, lora, index) for index in range(arch.num_layers)]
        for block, names in zip(blocks, in_block.values(), strict=True):
            add_module_at(self, common_prefix(names.values()), block)
        registered = register_parameters(self, {hf_name: shapes[hf_name] for hf_name in hf_names.values()})
        for block, names in zip(blocks, in_block.values(), strict=True):
            block.slots = {canonical: registered[hf_name] for canonical, hf_name in names.items()}
        self.blocks = blocks
        self.slots = {canonical: registered[hf_name] for canonical, hf_name in hf_names.items()
                      if not canonical.startswith("block.")}
        """The parameters outside the blocks (embeddings, final norm, LM head)."""

    def forward(self, input_ids: torch.Tensor, **decoding) -> torch.Tensor | tuple:
        return decoder.forward(TorchOps(self.training, input_ids.device), read_slots(self.slots), self.arch, input_ids,
                               lora=self.lora, layer=lambda index, *args: self.blocks[index](*args), **decoding)


class DecoderBlock(Layer):
    """One decoder layer (`tpuplex.models.decoder.block`), its parameters registered below it under their HF names
    and read through `slots` when it runs (FSDP2 has gathered them by then)."""

    def __init__(self, arch: DecoderArch, lora: Lora | None, index: int):
        super().__init__()
        self.arch, self.lora, self.index = arch, lora, index
        self.slots: Slots = {}

    def forward(self, x: torch.Tensor, *args) -> tuple[torch.Tensor, tuple | None]:
        return decoder.block(TorchOps(self.training, x.device), read_slots(self.slots), self.arch, self.lora,
                             self.index, x, *args)


def sample(logits: torch.Tensor, temperature: float, top_k: int, uniform: torch.Tensor) -> torch.Tensor:
    """int64 [B]: the most likely token of logits [B, V] (temperature 0), else the token where the CDF of
    softmax(logits / temperature), restricted to the top_k, first exceeds uniform [B]."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / temperature
    if top_k:
        kth = torch.topk(scaled, min(top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    cdf = torch.softmax(scaled, dim=-1).cumsum(dim=-1)
    chosen = (cdf < uniform[:, None] * cdf[:, -1:]).sum(dim=-1)
    return chosen.clamp(max=logits.shape[-1] - 1)


def logits(model: DecoderModel, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The next-token logits [b, L, V] of `input_ids` [b, L], or [b, K, V] at a chat batch's `target_positions`
    [b, K] (causal attention: no padding mask is needed, padding sits after every real token and is weighted 0)."""
    return model(batch["input_ids"], **head_inputs(batch, ("input_ids",)))


class Decoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        lora = spec.lora if spec.dropout or spec.lora is None else spec.lora.without_dropout()
        check_names(parameter_shapes(spec), spec.params, "model.params")
        return Built(DecoderModel(arch, parameter_names(spec), parameter_shapes(spec), lora), logits, spec.params)

    def generate(self, model: DecoderModel, prompts: Prompts) -> np.ndarray:
        """The prompts [B, P] through the model once, then one token per forward with the cache of P + N positions
        (or, without it, the whole sequence so far again at every step)."""
        device = next(model.parameters()).device
        rows, length = prompts.ids.shape
        total = length + prompts.new_tokens
        tokens = torch.zeros(rows, total, dtype=torch.int64, device=device)
        tokens[:, :length] = torch.from_numpy(np.asarray(prompts.ids, np.int64))
        key_mask = torch.ones_like(tokens)
        key_mask[:, :length] = torch.from_numpy(np.asarray(prompts.mask, np.int64))
        positions = (key_mask.cumsum(dim=1) - 1).clamp(min=0)
        uniforms = torch.from_numpy(np.asarray(prompts.uniforms, np.float32)).to(device)
        a, dtype = model.arch, next(model.parameters()).dtype
        was_training = model.training
        model.eval()
        with torch.no_grad():
            cache = tuple((torch.zeros(rows, total, a.num_kv_heads, a.head_dim, dtype=dtype, device=device),
                           torch.zeros(rows, total, a.num_kv_heads, a.head_dim, dtype=dtype, device=device))
                          for _ in range(a.num_layers))
            begin = 0
            for step in range(prompts.new_tokens):
                end = length + step  # the next token's place
                if prompts.cache:
                    logits, cache = model(tokens[:, begin:end], positions=positions[:, begin:end], cache=cache,
                                          cache_index=begin, key_mask=key_mask)
                    begin = end
                else:
                    logits = model(tokens[:, :end], positions=positions[:, :end], key_mask=key_mask[:, :end])
                tokens[:, end] = sample(logits[:, -1].float(), prompts.temperature, prompts.top_k, uniforms[:, step])
        model.train(was_training)
        return tokens[:, length:].cpu().numpy().astype(np.int32)

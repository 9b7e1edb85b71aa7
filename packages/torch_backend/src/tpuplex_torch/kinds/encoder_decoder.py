"""T5 in PyTorch: the parameters held under their HF names, run by the forward pass written once
(`tpuplex.models.t5`) over torch's table of operations (`tpuplex_torch.ops.TorchOps`).

`T5Model` registers every parameter under its HF name in HF's layout, so `named_parameters()` is a
`from_pretrained` state dict. `generate` encodes once and decodes one token per call over a self-attention cache
(`tpuplex.models.search`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

import torch
from tpuplex.checkpoints import check_names
from tpuplex.kinds.encoder_decoder import parameter_names, parameter_shapes
from tpuplex.models import search, t5
from tpuplex.models.t5 import T5Arch
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts
from tpuplex_torch.kinds import Built, KindModule
from tpuplex_torch.ops import TorchOps, read_slots, register_parameters


class T5Model(torch.nn.Module):
    """(input_ids, attention_mask [B, S], decoder_input_ids [B, T]) -> next-token logits float32 [B, T, V]."""

    def __init__(self, arch: T5Arch, hf_names: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]]):
        """hf_names: canonical -> HF name of every parameter; shapes: HF name -> shape (HF layout)."""
        super().__init__()
        self.arch = arch
        registered = register_parameters(self, {hf: shapes[hf] for hf in hf_names.values()})
        self.slots = {canonical: registered[hf] for canonical, hf in hf_names.items()}

    def params(self) -> dict[str, torch.Tensor]:
        return read_slots(self.slots)

    def ops(self, like: torch.Tensor) -> TorchOps:
        return TorchOps(self.training, like.device)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                decoder_input_ids: torch.Tensor) -> torch.Tensor:
        return t5.forward(self.ops(input_ids), self.params(), self.arch, input_ids, attention_mask,
                          decoder_input_ids)


def logits(model: T5Model, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return model(batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"])


class EncoderDecoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        check_names(parameter_shapes(spec), spec.params, "model.params")
        return Built(T5Model(arch, parameter_names(spec), parameter_shapes(spec)), logits, spec.params)

    def generate(self, model: T5Model, prompts: Prompts) -> np.ndarray:
        """The inputs [B, S] through the encoder once, then `tpuplex.models.search` over one decoder step a token,
        each layer's self-attention cache [B * beams, N, heads, D] reordered by the search's `origin`."""
        device, arch = next(model.parameters()).device, model.arch
        rows, beams = prompts.ids.shape[0], prompts.beams
        ids = torch.from_numpy(np.repeat(np.asarray(prompts.ids, np.int64), beams, axis=0)).to(device)
        mask = torch.from_numpy(np.repeat(np.asarray(prompts.mask, np.int64), beams, axis=0)).to(device)
        was_training = model.training
        model.eval()
        with torch.no_grad():
            ops, p = model.ops(ids), model.params()
            dtype = p["embeddings.word.weight"].dtype
            cross = t5.cross_keys(ops, p, arch, t5.encode(ops, p, arch, ids, mask))
            shape = (rows * beams, prompts.new_tokens, arch.num_heads, arch.head_dim)
            cache = tuple((torch.zeros(shape, dtype=dtype, device=device),) * 2 for _ in range(arch.decoder_layers))

            def step(tokens: np.ndarray, origin: np.ndarray, position: int) -> np.ndarray:
                nonlocal cache
                order = torch.from_numpy(origin.astype(np.int64)).to(device)
                cache = tuple((k.index_select(0, order), v.index_select(0, order)) for k, v in cache)
                current = torch.from_numpy(tokens.astype(np.int64)).to(device)[:, None]
                logits, cache = t5.decode(ops, p, arch, current, None, mask, cross=cross, cache=cache,
                                          cache_index=position)
                return logits[:, 0].float().cpu().numpy()

            tokens = search.generate(step, prompts, arch.decoder_start_id, arch.eos_id, arch.pad_id)
        model.train(was_training)
        return tokens


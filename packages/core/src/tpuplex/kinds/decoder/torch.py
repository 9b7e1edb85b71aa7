"""Decoder families in PyTorch: transformers' own `GPT2LMHeadModel` / `LlamaForCausalLM` from the checkpoint's
config, with the core's initial weights (HF names) loaded strictly; generation with HF's key/value cache."""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import numpy as np
import transformers

import torch
from tpuplex.kinds.torch import Built, KindModule, hf_model, load_parameters
from tpuplex.protocol import ModelSpec, OptimizerSpec, Prompts

# transformers 5.24 renamed the key/value cache's argument and output `past_key_values` -> `cache`.
CACHE = "cache" if "cache" in inspect.signature(transformers.GPT2LMHeadModel.forward).parameters else "past_key_values"


class Decoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        model = hf_model(spec, {})
        load_parameters(model, spec.params, spec.family.tied_names(spec.arch))
        return Built(model, logits, spec.params)

    def generate(self, model: torch.nn.Module, prompts: Prompts) -> np.ndarray:
        """HF's forward on the left-padded prompts, then one token at a time with its cache (or, without, the whole
        sequence again at every step); positions count each row's real tokens."""
        device = next(model.parameters()).device
        tensor = lambda array: torch.from_numpy(np.asarray(array, np.int64)).to(device)  # noqa: E731
        rows, length = prompts.ids.shape
        ids = torch.zeros(rows, length + prompts.new_tokens, dtype=torch.int64, device=device)
        ids[:, :length] = tensor(prompts.ids)
        mask = torch.ones_like(ids)
        mask[:, :length] = tensor(prompts.mask)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        uniforms = torch.from_numpy(np.asarray(prompts.uniforms, np.float32)).to(device)
        was_training = model.training
        model.eval()
        with torch.no_grad():
            past, end = None, length
            for step in range(prompts.new_tokens):
                if prompts.cache:
                    begin = 0 if past is None else end - 1
                    out = model(input_ids=ids[:, begin:end], attention_mask=mask[:, :end],
                                position_ids=positions[:, begin:end], use_cache=True, **{CACHE: past})
                    past = getattr(out, CACHE)
                else:
                    out = model(input_ids=ids[:, :end], attention_mask=mask[:, :end], position_ids=positions[:, :end],
                                use_cache=False)
                ids[:, end] = sample(out.logits[:, -1].float(), prompts.temperature, prompts.top_k, uniforms[:, step])
                end += 1
        model.train(was_training)
        return ids[:, length:].cpu().numpy().astype(np.int32)


def logits(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The next-token logits [b, L, V] of `input_ids` [b, L] (causal attention: no padding mask is needed, padding
    sits after every real token and is weighted 0)."""
    return model(input_ids=batch["input_ids"], use_cache=False).logits


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

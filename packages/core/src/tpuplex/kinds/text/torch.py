"""Text encoder families in PyTorch: transformers' `AutoModelFor<Task>` (the task's `auto_class`) from the
checkpoint's config, into which the backend restores the core's initial weights (HF names, checked strictly), so
every HF encoder family builds the same way for every task."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
from tpuplex.kinds.torch import Built, KindModule, hf_model
from tpuplex.params import check_names
from tpuplex.protocol import ModelSpec, OptimizerSpec


class TextEncoder(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        """The HF family's model for the task, for `spec.params`; mismatched parameters raise TpuplexError naming
        them (a tied parameter, the MLM decoder, appears once, as in `named_parameters`)."""
        model = hf_model(spec, task.head_config(spec.head))
        check_names({name: tuple(p.shape) for name, p in model.named_parameters()}, spec.params, "model.params")
        return Built(model, functools.partial(forward_outputs, token_types=spec.arch.token_types,
                                              head_forward=task.forward), spec.params)


def forward_outputs(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], token_types: bool,
                    head_forward: Callable) -> torch.Tensor:
    """An HF model's logits (its task's: [b, num_labels], [b, P, vocab], ...) for int64 `input_ids`,
    `attention_mask` [b, L], and `token_type_ids` [b, L] when the family takes them (`Architecture.token_types`).
    `head_forward(model, encoder_inputs, inputs)` (the task module's `forward`) calls the model: its logits, or
    the masked LM's head on the masked positions only.

    The padding mask goes in already additive ([b, 1, 1, L]: 0 on real keys, float32's min on padding, as HF builds
    it), because HF would otherwise test `mask.all()` to skip it: a host sync and a data-dependent branch that
    would make XLA compile each shape twice.
    """
    keep = inputs["attention_mask"][:, None, None, :].bool()
    additive = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    segments = {"token_type_ids": inputs["token_type_ids"]} if token_types else {}
    encoder_inputs = {"input_ids": inputs["input_ids"], "attention_mask": additive, **segments}
    return head_forward(model, encoder_inputs, inputs)

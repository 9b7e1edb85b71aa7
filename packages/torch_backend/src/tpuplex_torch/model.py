"""The classifier: HF transformers `AutoModelForSequenceClassification` from the checkpoint's config, with the
core's initial weights (HF names) loaded strictly, so any HF encoder classifier family builds the same way; or the
user's own `torch.nn.Module` (`model.architecture`, see `tpuplex.models.user`) with its own initial weights."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import numpy as np
import torch.nn.functional as F
import transformers  # a lazy module: the model classes (and accelerate behind them) load on first use

import torch
from tpuplex import models
from tpuplex.models import user
from tpuplex.params import check_names
from tpuplex.protocol import ModelSpec

Forward = Callable[[torch.nn.Module, Mapping[str, torch.Tensor]], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Built:
    """A classifier on the CPU in float32, how to call it, and its initial parameters (numpy, by state-dict name)."""

    module: torch.nn.Module
    forward: Forward
    params: Mapping[str, np.ndarray]


def build(spec: ModelSpec, seed: int) -> Built:
    """The HF family's classifier from `spec.params`, or the user's module initialised under `torch.manual_seed(
    seed)`; every dropout off unless `spec.dropout`. Mismatched parameters raise TpuplexError naming them."""
    if spec.architecture:
        return _build_user_model(spec, seed)
    settings = dict(spec.hf_config)
    config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings, num_labels=spec.num_labels)
    if not spec.dropout:
        for key, value in config.to_dict().items():
            # hidden_dropout_prob, attention_probs_dropout_prob, classifier_dropout (None: falls back to hidden)...
            if "dropout" in key and (value is None or isinstance(value, float)):
                setattr(config, key, 0.0)
    model = transformers.AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    check_names(expected, spec.params, "the initial parameters")
    model.load_state_dict({name: torch.from_numpy(np.asarray(array, dtype=np.float32))
                           for name, array in spec.params.items()}, strict=True)
    token_types = models.architecture_of(spec.hf_config)[1].token_types
    return Built(model, functools.partial(forward_logits, token_types=token_types), spec.params)


def _build_user_model(spec: ModelSpec, seed: int) -> Built:
    torch.manual_seed(seed)
    module = user.build(spec.architecture, "torch", spec.vocab_size, spec.num_labels, torch.nn.Module,
                        "torch.nn.Module")
    module = module.float()
    if not spec.dropout:
        for layer in module.modules():
            if isinstance(layer, torch.nn.modules.dropout._DropoutNd):
                layer.p = 0.0
    params = {name: p.detach().numpy().copy() for name, p in module.named_parameters()}
    return Built(module, functools.partial(user_logits, architecture=spec.architecture,
                                                  num_labels=spec.num_labels), params)


def forward_logits(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], token_types: bool) -> torch.Tensor:
    """An HF classifier's logits [b, num_labels] for int64 `input_ids`, `attention_mask` [b, L], and
    `token_type_ids` [b, L] when the family takes them (`Architecture.token_types`).

    The padding mask goes in already additive ([b, 1, 1, L]: 0 on real keys, float32's min on padding, as HF builds
    it), because HF would otherwise test `mask.all()` to skip it: a host sync and a data-dependent branch that
    would make XLA compile each shape twice.
    """
    keep = inputs["attention_mask"][:, None, None, :].bool()
    additive = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    segments = {"token_type_ids": inputs["token_type_ids"]} if token_types else {}
    return model(input_ids=inputs["input_ids"], attention_mask=additive, **segments).logits


def user_logits(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], architecture: str,
                num_labels: int) -> torch.Tensor:
    """A user module's logits [b, num_labels]; its output is checked, since nothing else constrains it."""
    logits = model(inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"])
    shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
    user.check_logits(architecture, shape, inputs["input_ids"].shape[0], num_labels)
    return logits


def per_example_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Loss per row [b] in float32: cross-entropy for class labels, squared error for float (regression) labels
    against logits [b, 1]."""
    logits = logits.float()
    if labels.is_floating_point():
        return (logits[:, 0] - labels) ** 2
    return F.cross_entropy(logits, labels, reduction="none")

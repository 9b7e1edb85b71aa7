"""The classifier: HF transformers `AutoModelForSequenceClassification` from the checkpoint's config, with the
core's initial weights (HF names) loaded strictly, so any HF encoder classifier family builds the same way."""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F
import transformers  # a lazy module: the model classes (and accelerate behind them) load on first use

import torch
from tpuplex.params import check_names
from tpuplex.protocol import ModelSpec


def build(spec: ModelSpec) -> torch.nn.Module:
    """The classifier on the CPU in float32, weights from `spec.params`, every dropout off unless `spec.dropout`.

    A parameter set that does not match the architecture raises TpuplexError naming the differences.
    """
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
    return model


def forward_logits(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logits [b, num_labels] for int64 `input_ids`, `token_type_ids`, `attention_mask` [b, L].

    The padding mask goes in already additive ([b, 1, 1, L]: 0 on real keys, float32's min on padding, as HF builds
    it), because HF would otherwise test `mask.all()` to skip it: a host sync and a data-dependent branch that
    would make XLA compile each shape twice.
    """
    keep = inputs["attention_mask"][:, None, None, :].bool()
    additive = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    return model(input_ids=inputs["input_ids"], token_type_ids=inputs["token_type_ids"],
                 attention_mask=additive).logits


def per_example_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Loss per row [b] in float32: cross-entropy for class labels, squared error for float (regression) labels
    against logits [b, 1]."""
    logits = logits.float()
    if labels.is_floating_point():
        return (logits[:, 0] - labels) ** 2
    return F.cross_entropy(logits, labels, reduction="none")

"""The model: HF transformers' `AutoModelFor<Task>` (the task's `auto_class`) from the checkpoint's config, with
the core's initial weights (HF names) loaded strictly, so every HF encoder family builds the same way for every
task; or the user's own `torch.nn.Module` (`model.architecture`, see `tpuplex.models.user`) with its own initial
weights."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import numpy as np
import transformers  # a lazy module: the model classes (and accelerate behind them) load on first use

import torch
from tpuplex import models, tasks
from tpuplex.models import user
from tpuplex.params import check_names
from tpuplex.protocol import ModelSpec

Forward = Callable[[torch.nn.Module, Mapping[str, torch.Tensor]], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Built:
    """A model on the CPU in float32, how to call it, its initial parameters and its non-trainable state (numpy,
    by name: batch-norm statistics of a ResNet or of a user model; none for the text families)."""

    module: torch.nn.Module
    forward: Forward
    params: Mapping[str, np.ndarray]
    buffers: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)


def build(spec: ModelSpec, seed: int) -> Built:
    """The HF family's model for the task from `spec.params`, or the user's module initialised under
    `torch.manual_seed(seed)`; every dropout off unless `spec.dropout`. Mismatched parameters raise TpuplexError
    naming them."""
    if spec.architecture:
        return _build_user_model(spec, seed)
    task = tasks.backend_module(spec.task, "torch")
    model = _hf_model(spec, task.head_config(spec.head))
    family = models.family_of(spec.hf_config)
    if family in models.IMAGE_FAMILIES:
        return _with_image_family_weights(model, family, spec, task)
    expected = {name: tuple(parameter.shape) for name, parameter in model.named_parameters()}
    check_names(expected, spec.params, "the initial parameters")
    # Tied parameters (the MLM decoder) appear once in named_parameters, under both names in the state dict.
    tied = getattr(model, "_tied_weights_keys", None) or {}
    state = {name: torch.from_numpy(np.asarray(array, dtype=np.float32)) for name, array in spec.params.items()}
    model.load_state_dict(state | {alias: state[target] for alias, target in tied.items()}, strict=True)
    token_types = models.architecture_of(spec.hf_config)[1].token_types
    head_forward = getattr(task, "forward", None)
    return Built(model, functools.partial(forward_outputs, token_types=token_types, head_forward=head_forward),
                 spec.params)


def _hf_model(spec: ModelSpec, head_config: Mapping) -> torch.nn.Module:
    """transformers' model for the task (`spec.task.auto_class`) from the checkpoint's config.json, float32;
    every dropout rate 0 unless `spec.dropout`."""
    settings = dict(spec.hf_config)
    config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings, **head_config)
    if not spec.dropout:
        for key, value in config.to_dict().items():
            # hidden_dropout_prob, attention_probs_dropout_prob, classifier_dropout (None: falls back to hidden)...
            if "dropout" in key and (value is None or isinstance(value, float)):
                setattr(config, key, 0.0)
    return getattr(transformers, spec.task.auto_class).from_config(config, dtype=torch.float32)


def _with_image_family_weights(model: torch.nn.Module, family: models.ImageFamily, spec: ModelSpec,
                               task) -> Built:
    """HF's ResNet or ViT with the core's parameters and batch-norm statistics, in channels-last memory format
    (convolutions read NHWC directly: the host batch's own layout). A ResNet's stem follows the plan
    (`tpuplex.models.resnet`: the CIFAR stem swaps HF's 7x7 convolution and max-pool for its own)."""
    arch = family.architecture(spec.hf_config)
    if family is models.RESNET:
        stem, embedder = arch.stem, model.resnet.embedder
        embedder.embedder.convolution = torch.nn.Conv2d(stem.in_channels, stem.out_channels, stem.kernel,
                                                        stem.stride, stem.padding, bias=False)
        if not arch.embedding_pooling:
            embedder.pooler = torch.nn.Identity()
    expected = {name: tuple(parameter.shape) for name, parameter in model.named_parameters()}
    check_names(expected, spec.params, "the initial parameters")
    state = {name: torch.from_numpy(np.array(array)) for name, array in {**spec.params, **spec.buffers}.items()}
    model.load_state_dict(state, strict=True)
    model = model.to(memory_format=torch.channels_last)
    return Built(model, functools.partial(image_logits, model_inputs=task.model_inputs), spec.params, spec.buffers)


def image_logits(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                 model_inputs: Callable[[Mapping[str, torch.Tensor]], tuple[torch.Tensor, ...]]) -> torch.Tensor:
    """An HF image classifier's logits [b, classes] for the task's `model_inputs(inputs)` (pixel_values)."""
    return model(*model_inputs(inputs)).logits


def _build_user_model(spec: ModelSpec, seed: int) -> Built:
    torch.manual_seed(seed)
    module = user.build(spec.architecture, "torch", spec.model_arguments, torch.nn.Module, "torch.nn.Module")
    module = module.float()
    if not spec.dropout:
        for layer in module.modules():
            if isinstance(layer, torch.nn.modules.dropout._DropoutNd):
                layer.p = 0.0
    params = {name: p.detach().numpy().copy() for name, p in module.named_parameters()}
    buffers = {name: b.detach().numpy().copy() for name, b in module.state_dict().items() if name not in params}
    task = tasks.backend_module(spec.task, "torch")
    return Built(module, functools.partial(user_logits, architecture=spec.architecture, num_labels=spec.num_labels,
                                           model_inputs=getattr(task, "model_inputs", text_inputs)), params, buffers)


def forward_outputs(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], token_types: bool,
                    head_forward: Callable | None = None) -> torch.Tensor:
    """An HF model's logits (its task's: [b, num_labels], [b, P, vocab], ...) for int64 `input_ids`,
    `attention_mask` [b, L], and `token_type_ids` [b, L] when the family takes them (`Architecture.token_types`).
    `head_forward(model, encoder_inputs, inputs)`, the task's torch module's `forward` where it has one, calls
    the model in place of `model(**encoder_inputs).logits` (the masked LM runs its head on the masked positions).

    The padding mask goes in already additive ([b, 1, 1, L]: 0 on real keys, float32's min on padding, as HF builds
    it), because HF would otherwise test `mask.all()` to skip it: a host sync and a data-dependent branch that
    would make XLA compile each shape twice.
    """
    keep = inputs["attention_mask"][:, None, None, :].bool()
    additive = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    segments = {"token_type_ids": inputs["token_type_ids"]} if token_types else {}
    encoder_inputs = {"input_ids": inputs["input_ids"], "attention_mask": additive, **segments}
    if head_forward is not None:
        return head_forward(model, encoder_inputs, inputs)
    return model(**encoder_inputs).logits


def text_inputs(inputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """What a text model of your own is called with: input_ids, token_type_ids, attention_mask int64 [b, L]."""
    return inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"]


def user_logits(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], architecture: str, num_labels: int,
                model_inputs: Callable[[Mapping[str, torch.Tensor]], tuple[torch.Tensor, ...]]) -> torch.Tensor:
    """A user module's logits [b, num_labels] from `model_inputs(inputs)` (the task module's, or `text_inputs`);
    its output is checked, since nothing else constrains it."""
    arguments = model_inputs(inputs)
    logits = model(*arguments)
    shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
    user.check_logits(architecture, shape, arguments[0].shape[0], num_labels)
    return logits


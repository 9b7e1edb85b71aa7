"""Image families in PyTorch: transformers' own `ResNetForImageClassification` / `ViTForImageClassification`
from the checkpoint's config, for the core's parameters and batch-norm statistics (the backend restores them)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
from tpuplex import models
from tpuplex.kinds.torch import Built, KindModule, hf_model
from tpuplex.params import check_names
from tpuplex.protocol import ModelSpec, OptimizerSpec


class ImageFamily(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        """HF's ResNet or ViT in channels-last memory format (convolutions read NHWC directly: the host batch's
        own layout). A ResNet's stem follows the plan (`tpuplex.models.resnet`: the CIFAR stem swaps HF's 7x7
        convolution and max-pool for its own)."""
        model, arch = hf_model(spec, task.head_config(spec.head)), spec.arch
        if spec.family is models.RESNET:
            stem, embedder = arch.stem, model.resnet.embedder
            embedder.embedder.convolution = torch.nn.Conv2d(stem.in_channels, stem.out_channels, stem.kernel,
                                                            stem.stride, stem.padding, bias=False)
            if not arch.embedding_pooling:
                embedder.pooler = torch.nn.Identity()
        expected = {name: tuple(parameter.shape) for name, parameter in model.named_parameters()}
        check_names(expected, spec.params, "the initial parameters")
        model = model.to(memory_format=torch.channels_last)
        return Built(model, functools.partial(image_logits, model_inputs=task.model_inputs), spec.params,
                     spec.buffers)


def image_logits(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                 model_inputs: Callable[[Mapping[str, torch.Tensor]], tuple[torch.Tensor, ...]]) -> torch.Tensor:
    """An HF image classifier's logits [b, classes] for the task's `model_inputs(inputs)` (pixel_values)."""
    return model(*model_inputs(inputs)).logits

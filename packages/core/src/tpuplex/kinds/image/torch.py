"""Image families in PyTorch. The ViT is the forward pass written once (`tpuplex.models.vit.forward`) over torch's
table of operations (`tpuplex.layers.torch.TorchOps`), its parameters registered under their HF names and each
layer a `Layer` (FSDP2's unit); the ResNet is transformers' own `ResNetForImageClassification` from the
checkpoint's config. Both take the core's parameters and batch-norm statistics (the backend restores them)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import numpy as np

import torch
from tpuplex import models
from tpuplex.kinds.torch import Built, KindModule, hf_model
from tpuplex.layers.torch import Layer, TorchOps, add_module_at, register_parameters
from tpuplex.models import vit
from tpuplex.params import check_names
from tpuplex.protocol import ModelSpec, OptimizerSpec


class ViTModel(torch.nn.Module):
    """pixel_values float32 [B, C, H, W] (a channels-last view of the host's images) -> logits [B, num_labels]."""

    def __init__(self, arch: vit.ViT, shapes: Mapping[str, tuple[int, ...]]):
        super().__init__()
        self.arch = arch
        blocks = [ViTBlock(arch, index) for index in range(arch.num_layers)]
        for index, block in enumerate(blocks):
            add_module_at(self, f"vit.layers.{index}", block)
        registered = register_parameters(self, shapes)
        for index, block in enumerate(blocks):
            block.slots = {name: slot for name, slot in registered.items()
                           if name.startswith(f"vit.layers.{index}.")}
        self.blocks = blocks
        self.slots = {name: slot for name, slot in registered.items() if not name.startswith("vit.layers.")}

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        images = pixel_values.permute(0, 2, 3, 1)  # NHWC: the host batch's own layout, no copy
        return vit.forward(TorchOps(self.training, images.device), _read(self.slots), self.arch, images,
                           layer=lambda index, x: self.blocks[index](x))


class ViTBlock(Layer):
    """One ViT layer (`tpuplex.models.vit.block`), its parameters registered below it under their HF names and read
    through `slots` when it runs (FSDP2 has gathered them by then)."""

    def __init__(self, arch: vit.ViT, index: int):
        super().__init__()
        self.arch, self.index = arch, index
        self.slots: dict[str, tuple[torch.nn.Module, str]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return vit.block(TorchOps(self.training, x.device), _read(self.slots), self.arch, self.index, x)


def _read(slots: Mapping[str, tuple[torch.nn.Module, str]]) -> dict[str, torch.Tensor]:
    return {name: getattr(owner, leaf) for name, (owner, leaf) in slots.items()}


class ImageFamily(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        """The family's model in channels-last memory format (convolutions read NHWC directly: the host batch's own
        layout). A ResNet's stem follows the plan (`tpuplex.models.resnet`: the CIFAR stem swaps HF's 7x7
        convolution and max-pool for its own)."""
        arch = spec.arch
        if spec.family is models.VIT:
            arch = arch if spec.dropout else arch.without_dropout()
            model = ViTModel(arch, {name: tuple(np.shape(array)) for name, array in spec.params.items()})
            check_names(arch.parameter_shapes(spec.num_labels), spec.params, "the initial parameters")
            return Built(model, functools.partial(image_logits, model_inputs=task.model_inputs), spec.params,
                         spec.buffers)
        model = hf_model(spec, task.head_config(spec.head))
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
    """An image classifier's logits [b, classes] for the task's `model_inputs(inputs)` (pixel_values)."""
    outputs = model(*model_inputs(inputs))
    return outputs if isinstance(outputs, torch.Tensor) else outputs.logits

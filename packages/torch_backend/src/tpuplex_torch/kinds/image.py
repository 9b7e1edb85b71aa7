"""Image families in PyTorch: each the forward pass written once (`tpuplex.models.vit.forward`,
`tpuplex.models.resnet.forward`) over torch's table of operations (`tpuplex_torch.ops.TorchOps`), its parameters
registered under their HF names (a ViT layer a `Layer`, FSDP2's unit). Both take the core's parameters and
batch-norm statistics (the backend restores them)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
from tpuplex import models
from tpuplex.checkpoints import check_names
from tpuplex.models import resnet, vit
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_torch.kinds import Built, KindModule
from tpuplex_torch.ops import Layer, Slots, TorchOps, add_module_at, read_slots, register_parameters


class ViTModel(torch.nn.Module):
    """pixel_values float32 [B, C, H, W] (a channels-last view of the host's images) -> logits [B, num_labels]."""

    def __init__(self, arch: vit.ViT, num_labels: int):
        super().__init__()
        self.arch = arch
        blocks = [ViTBlock(arch, index) for index in range(arch.num_layers)]
        for index, block in enumerate(blocks):
            add_module_at(self, f"vit.layers.{index}", block)
        registered = register_parameters(self, arch.parameter_shapes(num_labels))
        for index, block in enumerate(blocks):
            block.slots = {name: slot for name, slot in registered.items()
                           if name.startswith(f"vit.layers.{index}.")}
        self.blocks = blocks
        self.slots = {name: slot for name, slot in registered.items() if not name.startswith("vit.layers.")}

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        images = pixel_values.permute(0, 2, 3, 1)  # NHWC: the host batch's own layout, no copy
        return vit.forward(TorchOps(self.training, images.device), read_slots(self.slots), self.arch, images,
                           layer=lambda index, x: self.blocks[index](x))


class ViTBlock(Layer):
    """One ViT layer (`tpuplex.models.vit.block`), its parameters registered below it under their HF names and read
    through `slots` when it runs (FSDP2 has gathered them by then)."""

    def __init__(self, arch: vit.ViT, index: int):
        super().__init__()
        self.arch, self.index = arch, index
        self.slots: Slots = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return vit.block(TorchOps(self.training, x.device), read_slots(self.slots), self.arch, self.index, x)


class ResNetModel(torch.nn.Module):
    """pixel_values float32 [B, C, H, W] (a channels-last view of the host's images) -> logits [B, num_labels]: the
    forward pass written once (`tpuplex.models.resnet.forward`), the convolutions and the classifier registered
    under their HF names, each batch norm torch's `BatchNorm2d` at its HF module name (which
    `SyncBatchNorm.convert_sync_batchnorm` turns cross-replica)."""

    def __init__(self, arch: resnet.ResNet, num_labels: int):
        super().__init__()
        self.arch = arch
        for conv in arch.convs():
            add_module_at(self, f"{conv.name}.normalization", torch.nn.BatchNorm2d(conv.out_channels))
        self.slots = register_parameters(self, arch.forward_shapes(num_labels))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        images = pixel_values.permute(0, 2, 3, 1)  # NHWC: the host batch's own layout, no copy

        def batch_norm(module: str, x: torch.Tensor) -> torch.Tensor:
            return self.get_submodule(module)(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)

        return resnet.forward(TorchOps(self.training, images.device), read_slots(self.slots), self.arch, images,
                              batch_norm)


class ImageFamily(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        """The family's model in channels-last memory format (convolutions read NHWC directly: the host batch's own
        layout)."""
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        check_names(arch.parameter_shapes(spec.num_labels), spec.params, "the initial parameters")
        model = (ViTModel if spec.family is models.VIT else ResNetModel)(arch, spec.num_labels)
        return Built(model.to(memory_format=torch.channels_last),
                     functools.partial(image_logits, model_inputs=task.model_inputs), spec.params, spec.buffers)


def image_logits(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                 model_inputs: Callable[[Mapping[str, torch.Tensor]], tuple[torch.Tensor, ...]]) -> torch.Tensor:
    """An image classifier's logits [b, classes] for the task's `model_inputs(inputs)` (pixel_values)."""
    return model(*model_inputs(inputs))

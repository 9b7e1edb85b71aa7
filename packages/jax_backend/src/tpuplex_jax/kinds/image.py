"""The image families (`tpuplex.models.resnet`, `tpuplex.models.vit`) in Flax linen: each its forward pass written
once (`tpuplex.models.vit.forward`, `tpuplex.models.resnet.forward`) over `JaxOps`, the parameters under their HF
names in torch's layout.

A ResNet's batch norm is a module at HF's module name (`resnet.encoder.stages.0.layers.1.layer.0.normalization`),
so a parameter's tree path is its HF name (`Naming.hf`); it is torch's `BatchNorm2d` (momentum 0.1, the running
variance unbiased), with its statistics in the `batch_stats` collection under torch's buffer names, so the three
backends and transformers share one checkpoint.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

import jax
from tpuplex.checkpoints import check_names
from tpuplex.kinds.image import example_image_shape
from tpuplex.models import resnet, vit
from tpuplex.models.resnet import ResNet
from tpuplex.models.vit import ViT
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_jax.kinds import Built, KindModule
from tpuplex_jax.ops import JaxOps, Naming, flax_views

MOMENTUM, EPSILON = 0.1, 1e-5
"""torch.nn.BatchNorm2d's defaults, which HF's ResNet keeps."""


class BatchNorm(nn.Module):
    """torch's BatchNorm2d on NHWC: [B, H, W, C] -> the same shape.

    Training normalises with the mean and (biased) variance of each of `groups` equal parts of the batch: 1 for the
    statistics of the whole global batch (cross-replica: R replicas compute what one computes on the global batch),
    R for each replica's B / R rows (per replica, as each framework does by default). The running statistics move
    by MOMENTUM towards the groups' mean, the variance corrected to unbiased with the count of rows a group saw.
    Statistics are float32 whatever the compute dtype.
    """

    groups: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        channels = x.shape[-1]
        weight = self.param("weight", nn.initializers.ones, (channels,))
        bias = self.param("bias", nn.initializers.zeros, (channels,))
        running_mean = self.variable("batch_stats", "running_mean", jnp.zeros, (channels,), jnp.float32)
        running_var = self.variable("batch_stats", "running_var", jnp.ones, (channels,), jnp.float32)
        count = self.variable("batch_stats", "num_batches_tracked", jnp.zeros, (), jnp.int32)
        values = x.astype(jnp.float32)
        if train:
            grouped = values.reshape(self.groups, -1, *values.shape[1:])  # [G, B / G, H, W, C]
            mean = grouped.mean(axis=(1, 2, 3), keepdims=True)
            variance = jnp.square(grouped - mean).mean(axis=(1, 2, 3), keepdims=True)
            normalised = ((grouped - mean) / jnp.sqrt(variance + EPSILON)).reshape(values.shape) * weight + bias
            if not self.is_initializing():
                rows = grouped.shape[1] * grouped.shape[2] * grouped.shape[3]
                running_mean.value = (1 - MOMENTUM) * running_mean.value + MOMENTUM * mean.reshape(-1, channels).mean(0)
                unbiased = variance.reshape(-1, channels).mean(0) * rows / max(rows - 1, 1)
                running_var.value = (1 - MOMENTUM) * running_var.value + MOMENTUM * unbiased
                count.value = count.value + 1
        else:
            normalised = (values - running_mean.value) / jnp.sqrt(running_var.value + EPSILON) * weight + bias
        return normalised.astype(self.dtype)


class ResNetClassifier(nn.Module):
    """images float32 [B, H, W, C] -> logits float32 [B, num_labels]: the forward pass written once
    (`tpuplex.models.resnet.forward`) over jax's table of operations, the convolutions and the classifier flat
    under their HF names, each batch norm a `BatchNorm` module at its HF module name."""

    arch: ResNet
    num_labels: int
    batch_norm_groups: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, images: jax.Array, train: bool = False, deterministic: bool = True) -> jax.Array:
        params = {name: self.param(name, nn.initializers.zeros, shape)
                  for name, shape in self.arch.forward_shapes(self.num_labels).items()}

        def batch_norm(module: str, x: jax.Array) -> jax.Array:
            return BatchNorm(self.batch_norm_groups, self.dtype, name=module)(x, train)

        return resnet.forward(JaxOps(self, deterministic, self.dtype), params, self.arch, images.astype(self.dtype),
                              batch_norm)


class ViTClassifier(nn.Module):
    """images float32 [B, H, W, C] -> logits float32 [B, num_labels]: the forward pass written once
    (`tpuplex.models.vit.forward`) over jax's table of operations, the parameters flat under their HF names."""

    arch: ViT
    num_labels: int
    batch_norm_groups: int = 1
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, images: jax.Array, train: bool = False, deterministic: bool = True) -> jax.Array:
        params = {name: self.param(name, nn.initializers.zeros, shape)
                  for name, shape in self.arch.parameter_shapes(self.num_labels).items()}
        return vit.forward(JaxOps(self, deterministic, self.dtype), params, self.arch, images.astype(self.dtype))


def image_model(arch: ResNet | ViT, num_labels: int, batch_norm_groups: int, dtype: Any) -> nn.Module:
    """The family's Flax classifier for `arch`; `batch_norm_groups`: the parts of a batch whose statistics batch
    norm takes apart (`BatchNorm.groups`)."""
    module = ResNetClassifier if isinstance(arch, ResNet) else ViTClassifier
    return module(arch, num_labels, batch_norm_groups, dtype)


class ImageFamily(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec, batch_shards: int) -> Built:
        """The image family's Flax classifier, its parameters and batch-norm statistics from the core (HF names),
        and the namings of both trees."""
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        groups = 1 if spec.batch_norm == "cross_replica" else batch_shards
        network = image_model(arch, spec.num_labels, groups, jnp.bfloat16 if optimizer.bf16 else jnp.float32)
        images = np.zeros((2, *example_image_shape(arch)), np.uint8)
        args, kwargs = task.model_inputs({"images": images}, False, False)
        template = jax.eval_shape(lambda: network.init(jax.random.key(0), *args, **kwargs))
        params_template, state_template = template["params"], {k: v for k, v in template.items() if k != "params"}
        naming = Naming.hf(params_template)
        state_naming = Naming.hf(state_template, collection=True)
        check_names(naming.shapes(params_template), spec.params, "model.params")
        check_names(state_naming.shapes(state_template), spec.buffers, "the batch-norm statistics")
        return Built(network, flax_views(spec.params, params_template, naming),
                     flax_views(spec.buffers, state_template, state_naming), naming, state_naming,
                     np.iinfo(np.int32).max)

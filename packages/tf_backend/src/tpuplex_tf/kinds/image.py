"""The image families (`tpuplex.models.resnet`, `tpuplex.models.vit`) in Keras 3: each its forward pass written once
(`tpuplex.models.resnet.forward`, `tpuplex.models.vit.forward`) over `TfOps`, a variable per HF name in torch's
layout (`hf_variables` lists them, none transposed).

A ResNet's batch norm is torch's `BatchNorm2d` (momentum 0.1, the running variance unbiased), its statistics
non-trainable variables under torch's buffer names; the count is int32 here (int64 in the checkpoint), equal on
every replica, so the step leaves it out of the replicas' average.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tpuplex.kinds.image import example_image_shape
from tpuplex.models import resnet, vit
from tpuplex.models.resnet import ResNet
from tpuplex.models.vit import ViT
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_tf.kinds import Built, KindModule
from tpuplex_tf.ops import TfOps, Variables

MOMENTUM, EPSILON = 0.1, 1e-5
"""torch.nn.BatchNorm2d's defaults, which HF's ResNet keeps."""


class BatchNorm(keras.layers.Layer):
    """torch's BatchNorm2d on NHWC: [B, H, W, C] -> the same shape; with `cross_replica`, training statistics
    are the mean over every replica's rows (R replicas compute what one computes on the global batch)."""

    def __init__(self, channels: int, cross_replica: bool, **kwargs):
        super().__init__(**kwargs)
        self.cross_replica = cross_replica
        # autocast=False: read in float32 under a bfloat16 policy, as the statistics are computed.
        self.weight = self.add_weight(shape=(channels,), initializer="ones", name="weight", autocast=False)
        self.bias = self.add_weight(shape=(channels,), initializer="zeros", name="bias", autocast=False)
        stat = lambda name, init, dtype="float32": self.add_weight(  # noqa: E731
            shape=(channels,) if name != "num_batches_tracked" else (), initializer=init, dtype=dtype,
            trainable=False, name=name, autocast=False)
        self.running_mean, self.running_var = stat("running_mean", "zeros"), stat("running_var", "ones")
        self.num_batches_tracked = stat("num_batches_tracked", "zeros", "int32")

    def call(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        compute_dtype, x = x.dtype, tf.cast(x, tf.float32)  # statistics in float32 under bfloat16 too
        if training:
            mean = self._across_replicas(tf.reduce_mean(x, axis=(0, 1, 2)))
            # The variance's gradient through the mean is zero (the deviations sum to 0): stopping it there, as
            # tf.nn.moments does, spares the backward pass a pass over x.
            variance = self._across_replicas(
                tf.reduce_mean(tf.math.squared_difference(x, tf.stop_gradient(mean)), axis=(0, 1, 2)))
            replicas = tf.distribute.get_strategy().num_replicas_in_sync if self.cross_replica else 1
            rows = tf.cast(tf.shape(x)[0] * tf.shape(x)[1] * tf.shape(x)[2] * replicas, tf.float32)
            self.running_mean.assign((1 - MOMENTUM) * self.running_mean + MOMENTUM * mean)
            self.running_var.assign((1 - MOMENTUM) * self.running_var
                                    + MOMENTUM * variance * rows / tf.maximum(rows - 1, 1.0))
            self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        else:
            mean, variance = self.running_mean, self.running_var
        # x * scale + shift, per-channel scale and shift (as tf.nn.batch_normalization): two elementwise ops on
        # x, forward and backward, where (x - mean) / std * weight + bias takes four.
        scale = tf.math.rsqrt(variance + EPSILON) * self.weight
        return tf.cast(x * scale + (self.bias - mean * scale), compute_dtype)

    def _across_replicas(self, value: tf.Tensor) -> tf.Tensor:
        context = tf.distribute.get_replica_context()
        if not self.cross_replica or context is None or context.num_replicas_in_sync == 1:
            return value
        return context.all_reduce(tf.distribute.ReduceOp.MEAN, value)

    def hf_variables(self, module: str) -> Variables:
        return {f"{module}.weight": (self.weight, False), f"{module}.bias": (self.bias, False)}

    def state_variables(self, module: str) -> dict[str, keras.Variable]:
        return {f"{module}.{name}": getattr(self, name)
                for name in ("running_mean", "running_var", "num_batches_tracked")}


class ResNetClassifier(keras.Model):
    """images float32 [B, H, W, C] -> logits float32 [B, num_labels]; `seed` set: training (batch statistics). The
    forward pass written once (`tpuplex.models.resnet.forward`) over TensorFlow's table of operations, a variable
    per HF name for the convolutions and the classifier, a `BatchNorm` layer per HF batch-norm module."""

    def __init__(self, arch: ResNet, num_labels: int, cross_replica: bool, **kwargs):
        super().__init__(**kwargs)
        self.arch = arch
        self.synchronises_replicas = cross_replica  # its batch norm all-reduces in the forward pass
        # autocast=False: read in float32 under a bfloat16 policy; the operations cast where a weight meets an
        # activation.
        self.named = {name: self.add_weight(shape=shape, initializer="zeros", name=name.replace(".", "_"),
                                            autocast=False)
                      for name, shape in arch.forward_shapes(num_labels).items()}
        self.norms = {f"{conv.name}.normalization": BatchNorm(conv.out_channels, cross_replica)
                      for conv in arch.convs()}

    def call(self, images: tf.Tensor, seed: tf.Tensor | None = None) -> tf.Tensor:
        training = seed is not None
        dtype = tf.as_dtype(self.compute_dtype)
        return resnet.forward(TfOps(seed, dtype), {name: v.value for name, v in self.named.items()}, self.arch,
                              tf.cast(images, dtype), lambda module, x: self.norms[module](x, training=training))

    def hf_variables(self) -> Variables:
        found: Variables = {name: (variable, False) for name, variable in self.named.items()}
        for module, norm in self.norms.items():
            found |= norm.hf_variables(module)
        return found

    def state_variables(self) -> dict[str, keras.Variable]:
        found: dict[str, keras.Variable] = {}
        for module, norm in self.norms.items():
            found |= norm.state_variables(module)
        return found


class ViTClassifier(keras.Model):
    """images float32 [B, H, W, C] -> logits float32 [B, num_labels]: the forward pass written once
    (`tpuplex.models.vit.forward`) over TensorFlow's table of operations, a variable per HF name."""

    def __init__(self, arch: ViT, num_labels: int, cross_replica: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.arch = arch
        self.synchronises_replicas = False  # no batch norm
        # autocast=False: read in float32 under a bfloat16 policy; the operations cast where a weight meets an
        # activation.
        self.named = {name: self.add_weight(shape=shape, initializer="zeros", name=name.replace(".", "_"),
                                            autocast=False)
                      for name, shape in arch.parameter_shapes(num_labels).items()}

    def call(self, images: tf.Tensor, seed: tf.Tensor | None = None) -> tf.Tensor:
        dtype = tf.as_dtype(self.compute_dtype)
        return vit.forward(TfOps(seed, dtype), {name: v.value for name, v in self.named.items()}, self.arch,
                           tf.cast(images, dtype))

    def hf_variables(self) -> Variables:
        return {name: (variable, False) for name, variable in self.named.items()}

    def state_variables(self) -> dict[str, keras.Variable]:
        return {}


def image_model(arch: ResNet | ViT, num_labels: int, cross_replica: bool) -> ResNetClassifier | ViTClassifier:
    """The family's Keras classifier for `arch`, its variables not created yet (call it once)."""
    module = ResNetClassifier if isinstance(arch, ResNet) else ViTClassifier
    return module(arch, num_labels, cross_replica)


class ImageFamily(KindModule):
    def build(self, spec: ModelSpec, task, optimizer: OptimizerSpec) -> Built:
        """The image family's classifier with every variable created (called under the strategy's scope and the
        dtype policy), to start from the core's parameters and batch-norm statistics."""
        arch = spec.arch if spec.dropout else spec.arch.without_dropout()
        module = image_model(arch, spec.num_labels, spec.batch_norm == "cross_replica")
        module(*task.model_inputs({"images": tf.zeros((2, *example_image_shape(arch)), tf.uint8)}))
        return Built(module, spec.params, spec.buffers, module.synchronises_replicas)

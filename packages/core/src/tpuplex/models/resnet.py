"""ResNet (HF `ResNetConfig`, `ResNetForImageClassification`), described once as a plan of convolutions.

    stem        conv k x k / stride, batch norm, ReLU [-> max-pool 3x3 / 2]      resnet.embedder
    residuals   per stage, `depths[i]` residual layers (basic: two 3x3 convs; bottleneck: 1x1, 3x3, 1x1 at a
                quarter of the width), each conv followed by batch norm (ReLU but on the last), plus the input
                (through a 1x1 conv and batch norm where the width or the stride changes), then ReLU
    head        global average pool -> Linear(hidden_sizes[-1], num_labels)    classifier.1

The forward pass (`forward`) walks that plan once, over the table of operations each framework gives
(`tpuplex.models.ops.Ops`), on the HF names and torch's layout, so the three backends run the same function on
the same numbers; which layer downsamples, and where, is decided here only. Convolutions pad kernel // 2 on every
side and have no bias, as HF's (torch's) do. Batch norm is the framework's (`forward`'s `batch_norm`): it holds
the running statistics, and how a batch's statistics are taken across replicas (`model.batch_norm`) is each
framework's own collective.

The CIFAR stem. HF's ResNetConfig always starts with a 7x7 stride-2 convolution and a max-pool, which leaves
a 32x32 image 8x8 before the first stage. tpuplex reads three more keys of config.json (HF keeps and ignores
them): `embedding_kernel_size` (default 7), `embedding_stride` (2) and `embedding_pooling` (true). The CIFAR
ResNets set 3, 1, false; the parameter names stay HF's, so only the stem convolution's shape differs from what
HF's own class would build.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tpuplex import initializers
from tpuplex.errors import TpuplexError
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.ops import Ops
from tpuplex.slices import SliceReader


@dataclasses.dataclass(frozen=True)
class Conv:
    """A convolution without bias, its batch norm and, if `relu`, a ReLU: HF's `ResNetConvLayer` (and, without
    the ReLU, `ResNetShortCut`) at module `name` (`{name}.convolution`, `{name}.normalization`)."""

    name: str
    in_channels: int
    out_channels: int
    kernel: int
    stride: int
    relu: bool

    @property
    def padding(self) -> int:
        return self.kernel // 2


@dataclasses.dataclass(frozen=True)
class Residual:
    """relu(convs(x) + shortcut(x)); `shortcut` None is the identity."""

    convs: tuple[Conv, ...]
    shortcut: Conv | None


@dataclasses.dataclass(frozen=True)
class ResNet:
    """Sizes and switches of one ResNet, read from an HF config.json (`read`)."""

    num_channels: int
    embedding_size: int
    hidden_sizes: tuple[int, ...]
    depths: tuple[int, ...]
    layer_type: str
    downsample_in_first_stage: bool
    downsample_in_bottleneck: bool
    embedding_kernel_size: int = 7
    embedding_stride: int = 2
    embedding_pooling: bool = True

    @property
    def stem(self) -> Conv:
        return Conv("resnet.embedder.embedder", self.num_channels, self.embedding_size, self.embedding_kernel_size,
                    self.embedding_stride, relu=True)

    def without_dropout(self) -> ResNet:
        """The same network: HF's ResNet has no dropout (the families share this interface with the ViT)."""
        return self

    @property
    def features(self) -> int:
        """Channels of the last stage: the classifier's input."""
        return self.hidden_sizes[-1]

    def residuals(self) -> tuple[Residual, ...]:
        """Every residual layer in order (HF's `ResNetStage`s and their `ResNetBasicLayer` /
        `ResNetBottleNeckLayer`)."""
        found = []
        widths = (self.embedding_size, *self.hidden_sizes)
        for stage, depth in enumerate(self.depths):
            for index in range(depth):
                first = index == 0
                in_channels = widths[stage] if first else widths[stage + 1]
                stride = (2 if stage > 0 or self.downsample_in_first_stage else 1) if first else 1
                found.append(self._residual(f"resnet.encoder.stages.{stage}.layers.{index}", in_channels,
                                            widths[stage + 1], stride))
        return tuple(found)

    def _residual(self, name: str, in_channels: int, out_channels: int, stride: int) -> Residual:
        shortcut = (Conv(f"{name}.shortcut", in_channels, out_channels, 1, stride, relu=False)
                    if in_channels != out_channels or stride != 1 else None)
        layer = f"{name}.layer"
        if self.layer_type == "basic":
            convs = (Conv(f"{layer}.0", in_channels, out_channels, 3, stride, relu=True),
                     Conv(f"{layer}.1", out_channels, out_channels, 3, 1, relu=False))
        else:
            reduced = out_channels // 4
            first_stride, middle_stride = (stride, 1) if self.downsample_in_bottleneck else (1, stride)
            convs = (Conv(f"{layer}.0", in_channels, reduced, 1, first_stride, relu=True),
                     Conv(f"{layer}.1", reduced, reduced, 3, middle_stride, relu=True),
                     Conv(f"{layer}.2", reduced, out_channels, 1, 1, relu=False))
        return Residual(convs, shortcut)

    def convs(self) -> tuple[Conv, ...]:
        """Every convolution, stem first, each residual's layers then its shortcut."""
        return (self.stem, *(conv for residual in self.residuals()
                             for conv in (*residual.convs, *((residual.shortcut,) if residual.shortcut else ()))))

    def forward_flops(self, rows: int, height: int, width: int, num_labels: int) -> float:
        """Forward FLOPs of `rows` images of height x width (`tpuplex.flops`): each convolution 2 k^2 C_in C_out
        per output pixel, and the classifier."""
        size = np.array([height, width])
        total, size = _conv_flops(self.stem, size)
        if self.embedding_pooling:  # HF's MaxPool2d(3, stride 2, padding 1)
            size = (size - 1) // 2 + 1
        for residual in self.residuals():
            if residual.shortcut:
                total += _conv_flops(residual.shortcut, size)[0]
            for conv in residual.convs:
                conv_flops, size = _conv_flops(conv, size)
                total += conv_flops
        return rows * (total + 2.0 * self.features * num_labels)

    def parameter_shapes(self, num_labels: int) -> dict[str, tuple[int, ...]]:
        """HF name -> torch-layout shape of every parameter (convolutions OIHW, Linear [out, in])."""
        shapes: dict[str, tuple[int, ...]] = {}
        for conv in self.convs():
            shapes[f"{conv.name}.convolution.weight"] = (conv.out_channels, conv.in_channels, conv.kernel,
                                                         conv.kernel)
            shapes[f"{conv.name}.normalization.weight"] = (conv.out_channels,)
            shapes[f"{conv.name}.normalization.bias"] = (conv.out_channels,)
        return shapes | {"classifier.1.weight": (num_labels, self.features), "classifier.1.bias": (num_labels,)}

    def forward_shapes(self, num_labels: int) -> dict[str, tuple[int, ...]]:
        """The parameters `forward` reads from its `p` (the convolutions and the classifier): every one but the batch
        norms' weights and biases, which the framework's batch norm holds."""
        norms = {f"{conv.name}.normalization.{leaf}" for conv in self.convs() for leaf in ("weight", "bias")}
        return {name: shape for name, shape in self.parameter_shapes(num_labels).items() if name not in norms}

    def buffer_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF name -> shape of every batch norm's running statistics and update count."""
        shapes: dict[str, tuple[int, ...]] = {}
        for conv in self.convs():
            norm = f"{conv.name}.normalization"
            shapes |= {f"{norm}.running_mean": (conv.out_channels,), f"{norm}.running_var": (conv.out_channels,),
                       f"{norm}.num_batches_tracked": ()}
        return shapes

    def initial_params(self, num_labels: int, seed: int) -> dict[str, SliceReader]:
        """HF's `ResNetPreTrainedModel._init_weights` (`tpuplex.initializers`, keyed by `seed`): convolutions
        Kaiming-normal (fan_out, ReLU gain), batch norms weight 1 and bias 0, the classifier torch's Linear default
        U(+-1/sqrt(fan_in))."""
        params: dict[str, SliceReader] = {}
        for name, shape in self.parameter_shapes(num_labels).items():
            if name.endswith("convolution.weight"):
                fan_out = shape[0] * shape[2] * shape[3]
                params[name] = initializers.normal(seed, name, shape, np.sqrt(2.0 / fan_out))
            elif name.startswith("classifier."):
                params[name] = initializers.uniform(seed, name, shape, 1.0 / np.sqrt(self.features))
            else:
                params[name] = np.full(shape, 1.0 if name.endswith("weight") else 0.0, np.float32)
        return params

    def initial_buffers(self) -> dict[str, np.ndarray]:
        """Running mean 0, running variance 1, no updates counted (torch's BatchNorm2d)."""
        return {name: np.ones(shape, np.float32) if name.endswith("running_var")
                else np.zeros(shape, np.int64 if name.endswith("num_batches_tracked") else np.float32)
                for name, shape in self.buffer_shapes().items()}


def forward(ops: Ops, p: Mapping[str, Any], arch: ResNet, images: Any,
            batch_norm: Callable[[str, Any], Any]) -> Any:
    """Logits float32 [B, num_labels] of images [B, H, W, C] in the compute dtype (channels last).

    p: HF name -> parameter (convolutions OIHW, the classifier [out, in]). batch_norm(module, x) -> x: the
    framework's torch-style BatchNorm2d at HF module `module` (`{conv}.normalization`) on x [B, H, W, C], holding
    its weight, bias and running statistics, training on the batch's statistics or not as the framework's module
    does.
    """
    def conv_norm(x: Any, conv: Conv) -> Any:
        x = ops.conv2d_nhwc(x, p[f"{conv.name}.convolution.weight"], conv.stride, conv.padding)
        x = batch_norm(f"{conv.name}.normalization", x)
        return ops.activation("relu", x) if conv.relu else x

    x = conv_norm(images, arch.stem)
    if arch.embedding_pooling:  # HF's MaxPool2d(3, stride 2, padding 1)
        x = ops.max_pool(x, 3, 2, 1)
    for residual in arch.residuals():
        out = x
        for conv in residual.convs:
            out = conv_norm(out, conv)
        x = ops.activation("relu", out + (conv_norm(x, residual.shortcut) if residual.shortcut else x))
    pooled = ops.mean(ops.float32(x), (1, 2))
    return ops.float32(ops.linear(pooled, p["classifier.1.weight"], p["classifier.1.bias"]))


def read(config: ConfigReader) -> ResNet:
    """The ResNet a config.json describes (HF's defaults where a key is absent)."""
    layer_type = config.get("layer_type", str, "bottleneck")
    if layer_type not in ("basic", "bottleneck"):
        raise TpuplexError(f"layer_type = {layer_type!r} in {config.path} is not a ResNet layer: use \"basic\" or "
                           "\"bottleneck\"")
    if config.get("hidden_act", str, "relu") != "relu":
        raise TpuplexError(f"hidden_act in {config.path} is not supported for ResNets: tpuplex builds them with "
                           "\"relu\" (HF's default)")
    hidden_sizes, depths = (_positive_list(config, key, default) for key, default in
                            (("hidden_sizes", [256, 512, 1024, 2048]), ("depths", [3, 4, 6, 3])))
    if len(hidden_sizes) != len(depths):
        raise TpuplexError(f"{config.path} has {len(hidden_sizes)} hidden_sizes but {len(depths)} depths: give one "
                           "of each per stage")
    if layer_type == "bottleneck" and any(size % 4 for size in hidden_sizes):
        raise TpuplexError(f"hidden_sizes {hidden_sizes} in {config.path}: a bottleneck ResNet's widths must be "
                           "multiples of 4 (each bottleneck runs at a quarter of its width)")
    return ResNet(
        num_channels=config.positive("num_channels", 3), embedding_size=config.positive("embedding_size", 64),
        hidden_sizes=hidden_sizes, depths=depths, layer_type=layer_type,
        downsample_in_first_stage=config.get("downsample_in_first_stage", bool, False),
        downsample_in_bottleneck=config.get("downsample_in_bottleneck", bool, False),
        embedding_kernel_size=config.positive("embedding_kernel_size", 7),
        embedding_stride=config.positive("embedding_stride", 2),
        embedding_pooling=config.get("embedding_pooling", bool, True))


def _positive_list(config: ConfigReader, key: str, default: list[int]) -> tuple[int, ...]:
    values = config.get(key, list, default)
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise TpuplexError(f"{key} = {values!r} in {config.path} must be a non-empty list of positive integers: "
                           "fix the checkpoint's config.json")
    return tuple(values)


def _conv_flops(conv: Conv, size: np.ndarray) -> tuple[float, np.ndarray]:
    """Forward FLOPs of `conv` on a [C_in, *size] input, and its output's size (padding kernel // 2 leaves
    size / stride, rounded up)."""
    out = (size - 1) // conv.stride + 1
    return 2.0 * conv.kernel**2 * conv.in_channels * conv.out_channels * float(np.prod(out)), out

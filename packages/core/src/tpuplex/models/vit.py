"""Vision Transformer (HF `ViTConfig`, `ViTForImageClassification`), described once.

    patches     Conv(k = stride = patch_size) -> [B, N, hidden], N = (H / ph) * (W / pw), row-major
    embeddings  [cls_token; patches] + position_embeddings [1, N + 1, hidden] -> dropout
    layers      pre-LayerNorm blocks: x += attention(layernorm_before(x)); x += mlp(layernorm_after(x))
    head        layernorm -> the cls token -> classifier Linear(hidden, num_labels)

The parameter names are transformers 5's (`vit.layers.{i}.attention.q_proj`, `.mlp.fc1`, ...). The forward pass
(`forward`, `block`) is written once over the table of operations each framework gives (`tpuplex.models.ops.Ops`),
on the HF names and torch's layout, so the three backends run the same function on the same numbers. The patch
convolution (kernel = stride = patch) is a Linear over each patch's pixels, flattened as the OIHW kernel is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tpuplex import flops, initializers
from tpuplex.errors import TpuplexError
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.ops import Ops
from tpuplex.slices import SliceReader


@dataclasses.dataclass(frozen=True)
class ViT:
    """Sizes and switches of one ViT, read from an HF config.json (`read`)."""

    image_size: tuple[int, int]
    patch_size: tuple[int, int]
    num_channels: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    qkv_bias: bool
    hidden_dropout: float
    attention_dropout: float
    initializer_range: float

    @property
    def grid(self) -> tuple[int, int]:
        """Patches per column and per row."""
        return self.image_size[0] // self.patch_size[0], self.image_size[1] // self.patch_size[1]

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    def without_dropout(self) -> ViT:
        return dataclasses.replace(self, hidden_dropout=0.0, attention_dropout=0.0)

    def forward_flops(self, rows: int, height: int, width: int, num_labels: int) -> float:
        """Forward FLOPs of `rows` images (`tpuplex.flops`; a ViT takes images of `image_size` only): the patch
        projection, every layer over the patches and the class token, and the classifier."""
        hidden, tokens = self.hidden_size, self.num_patches + 1
        patch = 2.0 * self.num_patches * self.num_channels * self.patch_size[0] * self.patch_size[1] * hidden
        layer = flops.encoder_layer_flops(1, tokens, hidden, self.intermediate_size)
        return rows * (patch + self.num_layers * layer + 2.0 * hidden * num_labels)

    def parameter_shapes(self, num_labels: int) -> dict[str, tuple[int, ...]]:
        """HF name -> torch-layout shape of every parameter (the patch convolution OIHW, Linear [out, in])."""
        hidden, inner = self.hidden_size, self.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {
            "vit.embeddings.cls_token": (1, 1, hidden),
            "vit.embeddings.position_embeddings": (1, self.num_patches + 1, hidden),
            "vit.embeddings.patch_embeddings.projection.weight": (hidden, self.num_channels, *self.patch_size),
            "vit.embeddings.patch_embeddings.projection.bias": (hidden,),
        }
        for index in range(self.num_layers):
            layer = f"vit.layers.{index}"
            for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
                shapes[f"{layer}.attention.{projection}.weight"] = (hidden, hidden)
                if self.qkv_bias or projection == "o_proj":
                    shapes[f"{layer}.attention.{projection}.bias"] = (hidden,)
            for norm in ("layernorm_before", "layernorm_after"):
                shapes |= {f"{layer}.{norm}.weight": (hidden,), f"{layer}.{norm}.bias": (hidden,)}
            shapes |= {f"{layer}.mlp.fc1.weight": (inner, hidden), f"{layer}.mlp.fc1.bias": (inner,),
                       f"{layer}.mlp.fc2.weight": (hidden, inner), f"{layer}.mlp.fc2.bias": (hidden,)}
        return shapes | {"vit.layernorm.weight": (hidden,), "vit.layernorm.bias": (hidden,),
                         "classifier.weight": (num_labels, hidden), "classifier.bias": (num_labels,)}

    def buffer_shapes(self) -> dict[str, tuple[int, ...]]:
        """A ViT has no non-trainable state."""
        return {}

    def initial_params(self, num_labels: int, seed: int) -> dict[str, SliceReader]:
        """HF's ViT initialisation (`tpuplex.initializers`, keyed by `seed`): weights, the cls token and the
        position embeddings from N(0, initializer_range) truncated at +-2 (torch's trunc_normal_ default), biases 0,
        LayerNorms 1 and 0."""
        params: dict[str, SliceReader] = {}
        for name, shape in self.parameter_shapes(num_labels).items():
            if name.endswith("bias"):
                params[name] = np.zeros(shape, np.float32)
            elif "layernorm" in name:
                params[name] = np.ones(shape, np.float32)
            else:
                params[name] = initializers.normal(seed, name, shape, self.initializer_range, clip=2.0)
        return params

    def initial_buffers(self) -> dict[str, np.ndarray]:
        return {}


DROPOUT_SITES = 3
"""Dropout sites per layer (attention probabilities, the attention's and the MLP's outputs), after the
embeddings' site 0."""


def forward(ops: Ops, p: Mapping[str, Any], arch: ViT, images: Any,
            layer: Callable[[int, Any], Any] | None = None) -> Any:
    """logits float32 [B, num_labels] of images [B, H, W, C] (channels-last, in [0, 1], in the compute dtype).

    p: HF name -> parameter (the framework's tensors, torch's layout). layer(index, x) -> x: how a framework runs
    one layer (torch calls it as a module, so FSDP2 gathers its weights first); `block` over `p` by default.
    """
    a = arch
    (grid_h, grid_w), (patch_h, patch_w), hidden = a.grid, a.patch_size, a.hidden_size
    rows, channels = ops.shape(images)[0], a.num_channels
    # [B, gh * ph, gw * pw, C] -> [B, gh * gw, C * ph * pw]: each patch's pixels in the kernel's (C, ph, pw) order,
    # the patches row-major (torch's flatten(2) of the convolution's output).
    patches = ops.reshape(images, (rows, grid_h, patch_h, grid_w, patch_w, channels))
    patches = ops.reshape(ops.transpose(patches, (0, 1, 3, 5, 2, 4)),
                          (rows, grid_h * grid_w, channels * patch_h * patch_w))
    embeddings = "vit.embeddings"
    kernel = ops.reshape(p[f"{embeddings}.patch_embeddings.projection.weight"], (hidden, channels * patch_h * patch_w))
    patches = ops.linear(patches, kernel, p[f"{embeddings}.patch_embeddings.projection.bias"])
    cls = ops.broadcast_to(ops.cast_like(p[f"{embeddings}.cls_token"], images), (rows, 1, hidden))
    x = ops.concat([cls, ops.cast_like(patches, images)], axis=1)
    x = ops.dropout(x + ops.cast_like(p[f"{embeddings}.position_embeddings"], images), a.hidden_dropout, 0)
    run = layer or (lambda index, x: block(ops, p, a, index, x))
    for index in range(a.num_layers):
        x = run(index, x)
    first = ops.layer_norm(x, p["vit.layernorm.weight"], p["vit.layernorm.bias"], a.layer_norm_eps)[:, 0]
    return ops.float32(ops.linear(ops.float32(first), p["classifier.weight"], p["classifier.bias"]))


def block(ops: Ops, p: Mapping[str, Any], arch: ViT, index: int, x: Any) -> Any:
    """One pre-LayerNorm layer: x [B, N + 1, hidden] -> the same shape."""
    a = arch
    name, site = f"vit.layers.{index}", 1 + DROPOUT_SITES * index
    rows, tokens = ops.shape(x)[:2]
    heads, size = a.num_heads, a.hidden_size // a.num_heads
    sees = ops.arange(tokens)[None, None, :] >= 0  # [1, 1, S]: every token sees every token

    def linear(module: str, h: Any) -> Any:
        return ops.linear(h, p[f"{name}.{module}.weight"], p.get(f"{name}.{module}.bias"))

    h = ops.layer_norm(x, p[f"{name}.layernorm_before.weight"], p[f"{name}.layernorm_before.bias"], a.layer_norm_eps)
    query, key, value = (ops.reshape(linear(f"attention.{part}", h), (rows, tokens, heads, size))
                         for part in ("q_proj", "k_proj", "v_proj"))
    context = ops.attention(query, key, value, sees, False, 1.0 / math.sqrt(size), 0.0, a.attention_dropout, site)
    attended = linear("attention.o_proj", ops.reshape(context, (rows, tokens, a.hidden_size)))
    x = x + ops.dropout(attended, a.hidden_dropout, site + 1)
    h = ops.layer_norm(x, p[f"{name}.layernorm_after.weight"], p[f"{name}.layernorm_after.bias"], a.layer_norm_eps)
    inner = ops.activation(a.hidden_act, linear("mlp.fc1", h))
    return x + ops.dropout(linear("mlp.fc2", inner), a.hidden_dropout, site + 2)


def read(config: ConfigReader) -> ViT:
    """The ViT a config.json describes (HF's defaults where a key is absent)."""
    image_size, patch_size = (_pair(config, key, default) for key, default in (("image_size", 224),
                                                                               ("patch_size", 16)))
    if image_size[0] % patch_size[0] or image_size[1] % patch_size[1]:
        raise TpuplexError(f"image_size {list(image_size)} in {config.path} is not a whole number of "
                           f"{list(patch_size)} patches: make each side a multiple of patch_size")
    hidden, heads = config.positive("hidden_size", 768), config.positive("num_attention_heads", 12)
    if hidden % heads:
        raise TpuplexError(f"{config.path}: hidden size {hidden} is not divisible by {heads} attention heads: fix "
                           "the checkpoint's config.json")
    return ViT(image_size=image_size, patch_size=patch_size, num_channels=config.positive("num_channels", 3),
               hidden_size=hidden, num_layers=config.layers("num_hidden_layers", 12), num_heads=heads,
               intermediate_size=config.positive("intermediate_size", 3072),
               hidden_act=config.activation("hidden_act", "gelu"),
               layer_norm_eps=config.get("layer_norm_eps", float, 1e-12), qkv_bias=config.get("qkv_bias", bool, True),
               hidden_dropout=config.get("hidden_dropout_prob", float, 0.0),
               attention_dropout=config.get("attention_probs_dropout_prob", float, 0.0),
               initializer_range=config.get("initializer_range", float, 0.02))


def _pair(config: ConfigReader, key: str, default: int) -> tuple[int, int]:
    value = config.config.get(key, default)
    pair = [value, value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not (isinstance(pair, list | tuple) and len(pair) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pair)):
        raise TpuplexError(f"{key} = {value!r} in {config.path} must be a positive integer or [height, width]: fix "
                           "the checkpoint's config.json")
    return int(pair[0]), int(pair[1])

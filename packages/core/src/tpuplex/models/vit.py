"""Vision Transformer (HF `ViTConfig`, `ViTForImageClassification`), described once.

    patches     Conv(k = stride = patch_size) -> [B, N, hidden], N = (H / ph) * (W / pw), row-major
    embeddings  [cls_token; patches] + position_embeddings [1, N + 1, hidden] -> dropout
    layers      pre-LayerNorm blocks: x += attention(layernorm_before(x)); x += mlp(layernorm_after(x))
    head        layernorm -> the cls token -> classifier Linear(hidden, num_labels)

The parameter names are transformers 5's (`vit.layers.{i}.attention.q_proj`, `.mlp.fc1`, ...).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tpuplex import flops, initializers
from tpuplex.errors import TpuplexError
from tpuplex.models.family import ConfigReader
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

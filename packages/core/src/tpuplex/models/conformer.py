"""A Conformer for CTC speech recognition (Gulati et al., 2020; TensorFlowASR's `conformer` CTC models), described
once: its sizes (`ConformerArch`, from a config.json of `model_type = "conformer_ctc"`), its parameters (canonical
names, torch's layout) and its forward pass, written over the table of operations (`tpuplex.models.ops.Ops`) each
framework gives, so the three backends run the same function on the same numbers.

    features [B, T, mel]
    subsampling     two 3x3 convolutions of stride 2 (no padding), ReLU after each, then a Linear to the hidden
                    size: T' = ((T - 3) // 2 + 1 - 3) // 2 + 1 frames
    + sinusoidal positions, dropout
    blocks          x += 1/2 FFN(x);  x += MHSA(LN(x));  x += Conv(x);  x += 1/2 FFN(x);  x = LN(x)
                    FFN:  LN -> Linear(4H) -> Swish -> dropout -> Linear(H) -> dropout
                    Conv: LN -> pointwise Linear(2H) -> GLU -> depthwise conv (kernel K, zero "same" padding) ->
                          LN -> Swish -> pointwise Linear(H) -> dropout
    head            Linear(vocab): logits [B, T', vocab], and each utterance's T'

Chosen where the paper leaves a choice: absolute sinusoidal positions (not Transformer-XL's relative ones), and a
LayerNorm after the depthwise convolution where the paper has batch norm (no statistics to carry, and the same
output for an utterance whatever it is batched with). Frames past an utterance's end are zeroed before every
depthwise convolution and never attended to, so an utterance's outputs do not depend on its batch's padding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tpuplex.errors import TpuplexError
from tpuplex.initializers import drawn_as_hf
from tpuplex.models.config_reader import ConfigReader
from tpuplex.models.ops import Ops
from tpuplex.slices import SliceReader

MODEL_TYPE = "conformer_ctc"
INITIALIZERS = ("fan_in", "normal")
SERVED_FRAMES = 4096
"""The most frames after subsampling an exported model (SavedModel, torch.export) takes: 164 s of audio at a 10 ms
hop."""


@dataclasses.dataclass(frozen=True)
class ConformerArch:
    """Sizes of a Conformer-CTC, read from config.json; the mel bins and vocabulary come from the data."""

    hidden_size: int = 144
    num_layers: int = 4
    num_heads: int = 4
    ffn_multiplier: int = 4
    conv_kernel: int = 15
    subsampling_channels: int = 144
    dropout: float = 0.1
    layer_norm_eps: float = 1e-5
    initializer: str = "fan_in"
    """How weights start: "fan_in", N(0, 1 / (3 fan_in)), the variance of PyTorch's default Linear and Conv init
    (the Conformers of ESPnet and of a plain PyTorch loop start so); "normal", N(0, initializer_range) as BERT's."""
    initializer_range: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def without_dropout(self) -> ConformerArch:
        return dataclasses.replace(self, dropout=0.0)

    @staticmethod
    def output_frames(frames: Any) -> Any:
        """T' of T input frames (ints or arrays): two valid 3-wide convolutions of stride 2."""
        return ((frames - 3) // 2 + 1 - 3) // 2 + 1

    def forward_flops(self, rows: int, frames: int, mel_bins: int, vocab_size: int) -> float:
        """Forward FLOPs on [rows, frames] of features: the subsampling convolutions, every block's matrix
        products and attention, the head."""
        c, h = self.subsampling_channels, self.hidden_size
        f1 = (mel_bins - 3) // 2 + 1
        t1 = (frames - 3) // 2 + 1
        t2, f2 = self.output_frames(frames), (f1 - 3) // 2 + 1
        subsampling = 2 * rows * (t1 * f1 * c * 9 + t2 * f2 * c * c * 9 + t2 * c * f2 * h)
        per_frame = 2 * (2 * 2 * h * self.ffn_multiplier * h + 4 * h * h + 2 * h * h + h * h + h * self.conv_kernel)
        block = rows * t2 * per_frame + 4 * rows * t2 * t2 * h
        return float(subsampling + self.num_layers * block + 2 * rows * t2 * h * vocab_size)


@dataclasses.dataclass(frozen=True)
class SpeechFamily:
    """A speech model family: its config.json `model_type`s and how it reads them."""

    model_types: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.model_types[0]

    def architecture(self, hf_config: Mapping[str, Any], path: Path | str = "config.json") -> ConformerArch:
        return read(hf_config, path)


def read(hf_config: Mapping[str, Any], path: Path | str = "config.json") -> ConformerArch:
    config = ConfigReader(hf_config, path)
    defaults = ConformerArch()

    def value(name: str) -> Any:
        default = getattr(defaults, name)
        if type(default) is not int:
            return config.get(name, type(default), default)
        return config.layers(name, default) if name == "num_layers" else config.positive(name, default)

    arch = ConformerArch(**{field.name: value(field.name) for field in dataclasses.fields(ConformerArch)})
    if arch.hidden_size % arch.num_heads:
        raise TpuplexError(f"{path}: hidden_size {arch.hidden_size} does not divide into {arch.num_heads} heads")
    if arch.conv_kernel % 2 == 0:
        raise TpuplexError(f"{path}: conv_kernel = {arch.conv_kernel}: use an odd width (the padding is centred)")
    if arch.initializer not in INITIALIZERS:
        raise TpuplexError(f"{path}: initializer = {arch.initializer!r}: use one of {', '.join(INITIALIZERS)}")
    return arch


def parameter_shapes(arch: ConformerArch, mel_bins: int, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape (torch's layout: Linear [out, in], Conv2d [out, in, kh, kw], the depthwise
    convolution [H, 1, K]), in a fixed order."""
    c, h, inner = arch.subsampling_channels, arch.hidden_size, arch.ffn_multiplier * arch.hidden_size
    f2 = ((mel_bins - 3) // 2 + 1 - 3) // 2 + 1
    if f2 < 1:
        raise TpuplexError(f"task.mel_bins = {mel_bins} is too few for the Conformer's subsampling: use 7 or more")

    def linear(name: str, out: int, into: int) -> dict[str, tuple[int, ...]]:
        return {f"{name}.weight": (out, into), f"{name}.bias": (out,)}

    def norm(name: str) -> dict[str, tuple[int, ...]]:
        return {f"{name}.weight": (h,), f"{name}.bias": (h,)}

    shapes = {"subsampling.conv1.weight": (c, 1, 3, 3), "subsampling.conv1.bias": (c,),
              "subsampling.conv2.weight": (c, c, 3, 3), "subsampling.conv2.bias": (c,),
              **linear("subsampling.linear", h, c * f2)}
    for index in range(arch.num_layers):
        block = f"block.{index}"
        for ffn in ("ffn1", "ffn2"):
            shapes |= norm(f"{block}.{ffn}.norm") | linear(f"{block}.{ffn}.linear1", inner, h)
            shapes |= linear(f"{block}.{ffn}.linear2", h, inner)
            if ffn == "ffn1":
                shapes |= norm(f"{block}.attention.norm")
                for part in ("query", "key", "value", "output"):
                    shapes |= linear(f"{block}.attention.{part}", h, h)
                shapes |= norm(f"{block}.conv.norm") | linear(f"{block}.conv.pointwise1", 2 * h, h)
                shapes |= {f"{block}.conv.depthwise.weight": (h, 1, arch.conv_kernel),
                           f"{block}.conv.depthwise.bias": (h,)}
                shapes |= norm(f"{block}.conv.depthwise_norm") | linear(f"{block}.conv.pointwise2", h, h)
        shapes |= norm(f"{block}.final_norm")
    return shapes | linear("head", vocab_size, h)


def initial_params(arch: ConformerArch, mel_bins: int, vocab_size: int, seed: int) -> dict[str, SliceReader]:
    """Every parameter (`drawn_as_hf`, keyed by `seed`): weights as `arch.initializer` says, biases 0, norms 1."""
    shapes = parameter_shapes(arch, mel_bins, vocab_size)
    if arch.initializer == "normal":
        return drawn_as_hf(shapes, seed, lambda module: arch.initializer_range)
    # A weight's fan-in: its inputs times its kernel (Linear [out, in], Conv [out, in / groups, k...]).
    fan_in = {name.rsplit(".", 1)[0]: math.prod(shape[1:]) for name, shape in shapes.items() if len(shape) > 1}
    return drawn_as_hf(shapes, seed, lambda module: 1 / math.sqrt(3 * fan_in[module]))


def positions(frames: int, width: int) -> np.ndarray:
    """float32 [frames, width]: the Transformer's sinusoidal positions (sin on even, cos on odd features)."""
    position = np.arange(frames)[:, None]
    rates = np.exp(np.arange(0, width, 2) * (-math.log(10000.0) / width))
    table = np.zeros((frames, width), np.float64)
    table[:, 0::2], table[:, 1::2] = np.sin(position * rates), np.cos(position * rates)
    return table.astype(np.float32)


def forward(ops: Ops, p: Mapping[str, Any], arch: ConformerArch, features: Any, lengths: Any) -> Any:
    """logits [B, T', vocab] of features [B, T, mel] whose utterances have `lengths` [B] frames (the framework's
    integer tensor); the caller computes T' of each utterance with `ConformerArch.output_frames`."""
    rows, frames, mel = ops.shape(features)
    x = ops.activation("relu", ops.conv2d(ops.reshape(features, (rows, 1, frames, mel)), p["subsampling.conv1.weight"],
                            p["subsampling.conv1.bias"], 2))
    x = ops.activation("relu", ops.conv2d(x, p["subsampling.conv2.weight"], p["subsampling.conv2.bias"], 2))
    _, channels, out_frames, bins = ops.shape(x)
    x = ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (rows, out_frames, channels * bins))
    h = arch.hidden_size
    x = ops.linear(x, p["subsampling.linear.weight"], p["subsampling.linear.bias"])
    x = ops.dropout(x + ops.positions(out_frames, h)[None], arch.dropout, 0)
    real = ops.frame_mask(ConformerArch.output_frames(lengths), out_frames)  # [B, T'] 1.0 on the utterance
    site = 1
    for index in range(arch.num_layers):
        block = f"block.{index}"
        x = x + 0.5 * _ffn(ops, p, arch, f"{block}.ffn1", x, site)
        x = x + _attention(ops, p, arch, f"{block}.attention", x, real, site + 2)
        x = x + _convolution(ops, p, arch, f"{block}.conv", x, real, site + 4)
        x = x + 0.5 * _ffn(ops, p, arch, f"{block}.ffn2", x, site + 5)
        x = ops.layer_norm(x, p[f"{block}.final_norm.weight"], p[f"{block}.final_norm.bias"], arch.layer_norm_eps)
        site += 7
    return ops.linear(x, p["head.weight"], p["head.bias"])


def _norm(ops: Ops, p: Mapping[str, Any], arch: ConformerArch, name: str, x: Any) -> Any:
    return ops.layer_norm(x, p[f"{name}.weight"], p[f"{name}.bias"], arch.layer_norm_eps)


def _linear(ops: Ops, p: Mapping[str, Any], name: str, x: Any) -> Any:
    return ops.linear(x, p[f"{name}.weight"], p[f"{name}.bias"])


def _ffn(ops: Ops, p: Mapping[str, Any], arch: ConformerArch, name: str, x: Any, site: int) -> Any:
    inner = _linear(ops, p, f"{name}.linear1", _norm(ops, p, arch, f"{name}.norm", x))
    hidden = ops.dropout(ops.activation("silu", inner), arch.dropout, site)
    return ops.dropout(_linear(ops, p, f"{name}.linear2", hidden), arch.dropout, site + 1)


def _attention(ops: Ops, p: Mapping[str, Any], arch: ConformerArch, name: str, x: Any, real: Any,
               site: int) -> Any:
    """Multi-head self-attention over the utterance's own frames (real [B, T'] 1.0 on them)."""
    rows, frames, _ = ops.shape(x)
    heads, size = arch.num_heads, arch.head_dim
    h = _norm(ops, p, arch, f"{name}.norm", x)
    query, key, value = (ops.reshape(_linear(ops, p, f"{name}.{part}", h), (rows, frames, heads, size))
                         for part in ("query", "key", "value"))
    scores = ops.einsum("bqhd,bkhd->bhqk", query, key) * (1.0 / math.sqrt(size))
    scores = ops.where(real[:, None, None, :] > 0.5, scores, scores * 0.0 - 1e9)
    weights = ops.dropout(ops.softmax(scores), arch.dropout, site)
    context = ops.reshape(ops.einsum("bhqk,bkhd->bqhd", weights, value), (rows, frames, heads * size))
    return ops.dropout(_linear(ops, p, f"{name}.output", context), arch.dropout, site + 1)


def _convolution(ops: Ops, p: Mapping[str, Any], arch: ConformerArch, name: str, x: Any, real: Any,
                 site: int) -> Any:
    h = arch.hidden_size
    doubled = _linear(ops, p, f"{name}.pointwise1", _norm(ops, p, arch, f"{name}.norm", x))
    gated = doubled[..., :h] * ops.activation("sigmoid", doubled[..., h:])  # GLU over the features
    mixed = ops.depthwise_conv1d(gated * real[..., None], p[f"{name}.depthwise.weight"], p[f"{name}.depthwise.bias"])
    mixed = ops.activation("silu", _norm(ops, p, arch, f"{name}.depthwise_norm", mixed))
    return ops.dropout(_linear(ops, p, f"{name}.pointwise2", mixed), arch.dropout, site)


CONFORMER = SpeechFamily((MODEL_TYPE,))

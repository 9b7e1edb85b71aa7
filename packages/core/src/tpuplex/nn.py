"""Your network written once: parameters declared by name, shape and initialiser, a forward pass over `Ops`.

    from tpuplex import nn

    class BagOfWords(nn.Network):
        def __init__(self, vocab_size: int, num_labels: int):
            self.vocab_size, self.num_labels = vocab_size, num_labels

        def params(self) -> dict[str, nn.Param]:
            return {"embedding.weight": nn.Param((self.vocab_size, 64), nn.normal(0.1)),
                    "classifier.weight": nn.Param((self.num_labels, 64), nn.glorot_uniform()),
                    "classifier.bias": nn.Param((self.num_labels,), nn.zeros())}

        def __call__(self, ops: nn.Ops, params, input_ids, token_type_ids, attention_mask):
            real = ops.float32(attention_mask)[:, :, None]                            # [B, L, 1]
            tokens = ops.embed(params["embedding.weight"], input_ids)                 # [B, L, 64]
            mean = ops.sum(tokens * real, (1,)) / ops.sum(real, (1,))                 # [B, 64]
            return ops.linear(mean, params["classifier.weight"], params["classifier.bias"])

and `model.architecture = "my_module:BagOfWords"` in the config. The same class runs on the jax, tf and torch
backends, as tpuplex's own networks do (Keras 3 writes its layers once over `keras.ops` the same way): each
framework gives the operations (`Ops`: `TorchOps`, `JaxOps`, `TfOps`) and a holder of the parameters under the
names `params()` declares. Those names and shapes are the portable checkpoint's, so a run trained on one framework
evaluates, resumes and exports on the others; `runtime.mesh` lays each parameter out from its name and shape alone
(docs/sharding.md).

The initial values are drawn by the core from `train.seed`, a block at a time (`tpuplex.initializers`: each
element a function of the seed, the parameter's name and its offset), so every backend and every mesh starts from
the same numbers. Arithmetic, slicing (`x[:, None]`) and comparisons are the tensors' own operators in all three
frameworks; everything else is an op of the table (reductions too: `ops.sum`, `ops.mean`, `ops.max`). Weights
keep torch's layout (a Linear [out, in], a convolution [out, in, width]), the checkpoint's.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from tpuplex import initializers
from tpuplex.models.ops import Ops
from tpuplex.slices import Filled, SliceReader

Initializer = Callable[[int, str, tuple[int, ...]], SliceReader]
"""(seed, parameter name, shape) -> the parameter's initial value, read a block at a time."""


@dataclasses.dataclass(frozen=True)
class Param:
    """A parameter of `shape` (torch's layout: a Linear [out, in], a convolution [out, in, width]) whose initial
    value `init` draws."""

    shape: tuple[int, ...]
    init: Initializer

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(size) for size in self.shape))


class Network(abc.ABC):
    """A network written once. `__init__` takes the task's model arguments by keyword (a text classifier:
    `vocab_size`, `num_labels`; an image classifier: `num_labels`, `image_shape`); `params` declares every
    parameter; `__call__` is the forward pass over a framework's `Ops`, given the parameters by name as that
    framework's tensors and the task's model inputs (text: input_ids, token_type_ids, attention_mask int [B, L]),
    and returns what the task's loss takes (a classifier: logits float32 [B, num_labels]).

    Dropout is `ops.dropout(x, rate, site)`, `site` a number of its own at each place it is called: it is drawn
    in training when `model.dropout` is on, and is the identity otherwise.
    """

    @abc.abstractmethod
    def params(self) -> Mapping[str, Param]:
        """Every parameter by name (dotted, as a checkpoint's: `encoder.0.weight`)."""

    @abc.abstractmethod
    def __call__(self, ops: Ops, params: Mapping[str, Any], *inputs: Any) -> Any:
        """The forward pass: the task's model inputs -> its outputs."""


def initial_params(network: Network, seed: int) -> dict[str, SliceReader]:
    """Each parameter `network` declares, drawn from `seed` when read (a block at a time)."""
    return {name: param.init(seed, name, param.shape) for name, param in network.params().items()}


# Initialisers: small pure functions of (seed, name, shape). Fans count torch's layout [out, in, *window].
def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight [out, in, *window] (a vector: its length both ways)."""
    if len(shape) < 2:
        return (shape[0], shape[0]) if shape else (1, 1)
    window = math.prod(shape[2:])
    return shape[1] * window, shape[0] * window


def zeros() -> Initializer:
    return constant(0.0)


def ones() -> Initializer:
    return constant(1.0)


def constant(value: float) -> Initializer:
    return lambda seed, name, shape: Filled(shape, float(value))


def normal(std: float, clip: float | None = None) -> Initializer:
    """N(0, std^2), values beyond +-`clip` set to it (torch's `trunc_normal_` bounds)."""
    return lambda seed, name, shape: initializers.normal(seed, name, shape, std, clip)


def uniform(bound: float) -> Initializer:
    """U(-bound, bound)."""
    return lambda seed, name, shape: initializers.uniform(seed, name, shape, bound)


def glorot_uniform() -> Initializer:
    """U(-b, b), b = sqrt(6 / (fan_in + fan_out)): Keras' default for Dense and convolution kernels."""
    def draw(seed: int, name: str, shape: tuple[int, ...]) -> SliceReader:
        fan_in, fan_out = _fans(shape)
        return initializers.uniform(seed, name, shape, math.sqrt(6.0 / (fan_in + fan_out)))
    return draw


def fan_in_uniform() -> Initializer:
    """U(-b, b), b = 1 / sqrt(fan_in): torch's default for a Linear's and a convolution's weight and bias (give a
    bias the weight's fan-in with `fan_in_uniform_of`)."""
    def draw(seed: int, name: str, shape: tuple[int, ...]) -> SliceReader:
        return initializers.uniform(seed, name, shape, 1.0 / math.sqrt(_fans(shape)[0]))
    return draw


def fan_in_uniform_of(weight_shape: tuple[int, ...]) -> Initializer:
    """torch's default for the bias of a weight of `weight_shape`: U(-b, b), b = 1 / sqrt(the weight's fan_in)."""
    bound = 1.0 / math.sqrt(_fans(tuple(weight_shape))[0])
    return uniform(bound)


__all__ = ["Initializer", "Network", "Ops", "Param", "constant", "fan_in_uniform", "fan_in_uniform_of",
           "glorot_uniform", "initial_params", "normal", "ones", "uniform", "zeros"]

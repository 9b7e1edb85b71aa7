"""Initial parameters drawn a block at a time: any block of a drawn parameter without drawing the rest.

Every value is a function of (seed, parameter name, element offset) alone: element i of a parameter takes the
i-th 64-bit output of a Philox4x64 counter-based generator keyed by a hash of the seed and the name (numpy's
`Philox`, which jumps to any offset), turned into a normal or uniform number element by element. So the block a
device holds, drawn alone by the process that holds it, equals that block of the whole draw: every mesh (and the
replicated run) starts from the same numbers, and no process draws, or holds, a parameter it keeps only a slice of.

A normal value is Box-Muller's cosine branch: sqrt(-2 ln u1) cos(2 pi u2), u1 from the high 32 bits (in (0, 1)),
u2 from the low 24. Within one machine the numbers are bit for bit the same however a parameter is cut (tested);
another CPU's `cos` may round its last float32 bit differently.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Mapping
from typing import ClassVar

import numpy as np

from tpuplex.slices import BlockReader, Index, SliceReader, bounds

_PHILOX_OUTPUTS = 4
"""64-bit outputs per Philox4x64 counter value: element i is output i % 4 of counter i // 4."""
_PIECE = 1 << 16
"""Elements transformed at a time."""
_READ_PAST = 1 << 16
"""A gap between two runs of a block shorter than this is read through (cheaper than a new generator)."""


@dataclasses.dataclass(frozen=True)
class Drawn(BlockReader):
    """A parameter of `shape` drawn from N(0, scale^2) (`distribution` "normal", values outside +-`clip` set to
    it when given) or U(-scale, scale) ("uniform"), float32, read a block at a time (`tpuplex.slices.SliceReader`).
    `key`: the generator's 128-bit key (`key_of`)."""

    shape: tuple[int, ...]
    key: int
    distribution: str
    scale: float
    clip: float | None = None
    dtype: ClassVar[np.dtype] = np.dtype(np.float32)

    def __getitem__(self, index: Index) -> np.ndarray:
        wanted = bounds(index, self.shape)
        block = np.empty([stop - start for start, stop in wanted], np.float32)
        if block.size:
            run = _contiguous_run(wanted, self.shape)
            stream = _Stream(self.key)
            for row, start in enumerate(_run_starts(wanted, self.shape, run)):
                self._fill(block.reshape(-1, run)[row], stream, int(start))
        return block

    def _fill(self, out: np.ndarray, stream: _Stream, offset: int) -> None:
        """Write the values of elements offset .. offset + len(out) - 1 (flat, C order) into `out`, a piece at a
        time (in place, in the cache: whole-array temporaries cost more in page faults than in arithmetic)."""
        for first in range(0, len(out), _PIECE):
            raw = stream.read(offset + first, min(_PIECE, len(out) - first))
            if self.distribution == "uniform":
                values = (raw >> np.uint64(11)).astype(np.float64)
                values *= 2.0**-52
                values -= 1.0  # [-1, 1)
            else:
                halves = raw.view(np.uint32)  # little-endian: [low, high] of each output
                values = halves[1::2] + 0.5
                values *= 2.0**-32  # u1 in (0, 1)
                np.log(values, out=values)
                values *= -2.0
                np.sqrt(values, out=values)
                angle = (halves[0::2] & np.uint32(0xFFFFFF)).astype(np.float32)
                angle *= np.float32(2 * math.pi * 2.0**-24)
                # float32's cos: 20x faster than float64's without AVX-512, and all the precision a float32 needs.
                values *= np.cos(angle, out=angle)
            values *= self.scale
            if self.clip is not None:
                np.clip(values, -self.clip, self.clip, out=values)
            out[first:first + len(raw)] = values


class _Stream:
    """A key's 64-bit Philox outputs read at increasing offsets: a short gap is read past, a long one jumped."""

    def __init__(self, key: int):
        self.key = key
        self.generator: np.random.Philox | None = None
        self.position = 0

    def read(self, offset: int, count: int) -> np.ndarray:
        gap = offset - self.position
        if self.generator is None or not 0 <= gap <= _READ_PAST:
            self.generator = np.random.Philox(key=self.key, counter=offset // _PHILOX_OUTPUTS)
            gap = offset % _PHILOX_OUTPUTS
        if gap:
            self.generator.random_raw(gap)
        self.position = offset + count
        return self.generator.random_raw(count)


def key_of(seed: int, name: str) -> int:
    """The 128-bit Philox key of parameter `name` under `seed` (the same in every process and Python run)."""
    return int.from_bytes(hashlib.blake2b(f"{seed}\0{name}".encode(), digest_size=16).digest(), "little")


def normal(seed: int, name: str, shape: tuple[int, ...], std: float, clip: float | None = None) -> Drawn:
    """`name`'s initial value from N(0, std^2) (clipped to +-`clip`: torch's `trunc_normal_`), drawn when read."""
    return Drawn(tuple(shape), key_of(seed, name), "normal", float(std), clip)


def uniform(seed: int, name: str, shape: tuple[int, ...], bound: float) -> Drawn:
    """`name`'s initial value from U(-bound, bound), drawn when read."""
    return Drawn(tuple(shape), key_of(seed, name), "uniform", float(bound))


def drawn_as_hf(shapes: Mapping[str, tuple[int, ...]], seed: int,
                std: Callable[[str], float]) -> dict[str, SliceReader]:
    """Canonical name -> float32 initial value as HF initialises transformers: biases 0, a norm's (module
    `...norm`) weight 1, every other weight N(0, std(module)) keyed by its name (`normal`: drawn a block at a time,
    when a backend reads it). The families of every kind draw their fresh parameters with it."""
    params: dict[str, SliceReader] = {}
    for name, shape in shapes.items():
        module, leaf = name.rsplit(".", 1)
        if leaf == "bias":
            params[name] = np.zeros(shape, np.float32)
        elif module.endswith("norm"):
            params[name] = np.ones(shape, np.float32)
        else:
            params[name] = normal(seed, name, shape, std(module))
    return params


def _contiguous_run(wanted: tuple[tuple[int, int], ...], shape: tuple[int, ...]) -> int:
    """Elements of the block that lie next to each other in the whole (C order): the trailing dimensions the block
    covers whole, times its extent in the first one it cuts."""
    run = 1
    for (start, stop), size in zip(reversed(wanted), reversed(shape), strict=True):
        run *= stop - start
        if stop - start != size:
            break
    return run


def _run_starts(wanted: tuple[tuple[int, int], ...], shape: tuple[int, ...], run: int) -> np.ndarray:
    """Flat offsets in the whole of the block's runs of `run` elements, in the block's C order."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    starts = np.zeros(1, np.int64)
    covered = 1
    for d in reversed(range(len(shape))):
        if covered >= run:
            starts = np.add.outer(np.arange(*wanted[d], dtype=np.int64) * strides[d], starts).ravel()
        else:
            starts = starts + wanted[d][0] * strides[d]
            covered *= wanted[d][1] - wanted[d][0]
    return starts

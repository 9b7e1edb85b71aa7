"""Arrays held or read a slice at a time, so a sharded state is never whole in one process.

A process of a sharded run holds `Slice`s: each the block of a parameter (or moment) its devices keep, at its
offset in the whole. A checkpoint is written as those slices (`tpuplex.engine.checkpoint`) and read back through
`SliceReader`s, which give any block of the whole without reading the rest: a numpy array is one, so is a stored
checkpoint array, so is a `View` of either (transposed into a framework's layout, cast to its dtype). A backend
places a restored state by asking each reader for the blocks its devices hold.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

import numpy as np

Index = tuple[slice, ...]
"""A block of an array: one slice per dimension (steps of 1)."""


class SliceReader(Protocol):
    """An array that gives a block of itself as numpy without reading the rest (numpy arrays are readers)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    def __getitem__(self, index: Index) -> np.ndarray: ...


class BlockReader:
    """What tpuplex's own readers share (a `View`, `Filled`, a checkpoint's `StoredArray`, a drawn parameter, a
    merged LoRA weight): `np.asarray(reader)` is the whole (the block `()`), and `ndim` and `size` follow from
    `shape`. A subclass gives `shape`, `dtype` and `__getitem__`."""

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self[()]
        return whole if dtype is None else whole.astype(dtype, copy=False)


@dataclasses.dataclass(frozen=True)
class Slice:
    """The block `data` of an array of `shape`, starting at offset `start` (one per dimension)."""

    shape: tuple[int, ...]
    start: tuple[int, ...]
    data: np.ndarray

    @classmethod
    def whole(cls, array: np.ndarray) -> Slice:
        array = np.asarray(array)
        return cls(tuple(array.shape), (0,) * array.ndim, array)

    @property
    def is_whole(self) -> bool:
        return tuple(self.data.shape) == tuple(self.shape)

    def transposed(self, axes: tuple[int, ...]) -> Slice:
        """The same block of the array transposed by `axes` (as `np.transpose`)."""
        return Slice(tuple(self.shape[a] for a in axes), tuple(self.start[a] for a in axes),
                     np.ascontiguousarray(self.data.transpose(axes)))


def as_slices(value: np.ndarray | list[Slice]) -> list[Slice]:
    """A state value as slices: a backend's list of `Slice`s as it is, a whole array as one slice."""
    return list(value) if isinstance(value, (list, tuple)) else [Slice.whole(value)]


def bounds(index: Index, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(start, stop) per dimension of `index` within `shape`; a missing trailing slice means all of it."""
    index = tuple(index) + (slice(None),) * (len(shape) - len(tuple(index)))
    found = []
    for part, size in zip(index, shape, strict=True):
        start, stop, step = part.indices(size)
        if step != 1:
            raise ValueError(f"a block is read with steps of 1, not {step}")
        found.append((start, max(start, stop)))
    return tuple(found)


@dataclasses.dataclass(frozen=True)
class Filled(BlockReader):
    """`value` everywhere in `shape` (zeros: Adam's moments before the first step; a norm's ones), made a block at a
    time."""

    shape: tuple[int, ...]
    value: float = 0.0
    dtype: np.dtype = np.dtype(np.float32)

    def __getitem__(self, index: Index) -> np.ndarray:
        return np.full([stop - start for start, stop in bounds(index, self.shape)], self.value, self.dtype)


@dataclasses.dataclass(frozen=True)
class View(BlockReader):
    """`source` transposed by `axes` (None: as it is) and read as `cast` (None: its own dtype), block by block."""

    source: SliceReader
    axes: tuple[int, ...] | None = None
    cast: np.dtype | None = None

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.cast if self.cast is not None else self.source.dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        shape = tuple(self.source.shape)
        return shape if self.axes is None else tuple(shape[a] for a in self.axes)

    def __getitem__(self, index: Index) -> np.ndarray:
        wanted = bounds(index, self.shape)
        if self.axes is None:
            block = self.source[tuple(slice(*b) for b in wanted)]
        else:
            in_source = [slice(0)] * len(wanted)
            for position, axis in enumerate(self.axes):
                in_source[axis] = slice(*wanted[position])
            block = np.transpose(self.source[tuple(in_source)], self.axes)
        return np.asarray(block, dtype=self.dtype, order="C")  # ascontiguousarray would make a 0-d block [1]

"""A state written as slices (what each process of a sharded run holds) reads back block by block: any block of a
stored array equals that block of the whole, whatever slices hold it, and a checkpoint missing a slice is
refused."""

from __future__ import annotations

import numpy as np
import pytest

from tpuplex.engine import checkpoint
from tpuplex.errors import TpuplexError
from tpuplex.protocol import PortableState
from tpuplex.slices import Slice, View

RNG = np.random.default_rng(0)
KERNEL = RNG.normal(size=(12, 10)).astype(np.float32)
BIAS = RNG.normal(size=(10,)).astype(np.float32)
COUNT = np.asarray(7, np.int64)


def blocks(array: np.ndarray, rows: int, columns: int) -> list[Slice]:
    """`array` cut into rows x columns blocks, the last of each axis shorter where it does not divide."""
    row_size, column_size = -(-array.shape[0] // rows), -(-array.shape[1] // columns)
    return [Slice(array.shape, (r, c), array[r:r + row_size, c:c + column_size])
            for r in range(0, array.shape[0], row_size) for c in range(0, array.shape[1], column_size)]


def sliced_state(kernel_slices: list[Slice]) -> PortableState:
    return PortableState(params={"dense.weight": kernel_slices, "dense.bias": BIAS},
                         exp_avg={"dense.weight": blocks(2 * KERNEL, 4, 1), "dense.bias": 2 * BIAS},
                         exp_avg_sq={"dense.weight": blocks(3 * KERNEL, 1, 3), "dense.bias": 3 * BIAS},
                         step=3, buffers={"norm.num_batches_tracked": COUNT})


def test_any_block_of_a_sliced_checkpoint_reads_as_that_block_of_the_whole(tmp_path) -> None:
    written = checkpoint.save(tmp_path, sliced_state(blocks(KERNEL, 5, 3)), {"step": 3}, keep=1)
    stored, _ = checkpoint.load(written)
    kernel = stored.params["dense.weight"]
    assert kernel.shape == KERNEL.shape and kernel.dtype == np.float32
    for rows, columns in [(slice(0, 12), slice(0, 10)), (slice(1, 7), slice(3, 9)), (slice(11, 12), slice(None)),
                          (slice(4, 4), slice(0, 10))]:
        np.testing.assert_array_equal(kernel[rows, columns], KERNEL[rows, columns])
    np.testing.assert_array_equal(np.asarray(stored.exp_avg["dense.weight"]), 2 * KERNEL)
    np.testing.assert_array_equal(np.asarray(stored.exp_avg_sq["dense.weight"]), 3 * KERNEL)
    np.testing.assert_array_equal(np.asarray(stored.params["dense.bias"]), BIAS)
    assert np.asarray(stored.buffers["norm.num_batches_tracked"]).shape == () and stored.step == 3
    # A framework's layout and dtype, read a block at a time: Flax's [in, out] kernel in float64.
    flax = View(kernel, (1, 0), np.dtype(np.float64))
    assert flax.shape == (10, 12)
    np.testing.assert_array_equal(flax[2:5, 6:12], KERNEL.T[2:5, 6:12].astype(np.float64))
    count = View(stored.buffers["norm.num_batches_tracked"])
    assert count.shape == () and np.asarray(count).shape == () and int(np.asarray(count)) == 7  # 0-d stays 0-d


def test_a_checkpoint_missing_a_slice_is_refused(tmp_path) -> None:
    written = checkpoint.save(tmp_path, sliced_state(blocks(KERNEL, 2, 2)[:-1]), {"step": 3}, keep=1)
    with pytest.raises(TpuplexError, match=r"damaged: the slices of dense.weight hold 90 of its 120 elements"):
        checkpoint.load(written)

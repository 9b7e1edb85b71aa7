"""`tpuplex.models.weights.save_weights`: the safetensors file the library writes, written a block at a time."""

from __future__ import annotations

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

from tpuplex import initializers
from tpuplex.models.weights import save_weights


def test_saved_weights_are_what_safetensors_reads_written_a_block_at_a_time(tmp_path) -> None:
    drawn = initializers.normal(0, "embed", (300, 40), 0.02)
    read: list[tuple[slice, ...]] = []

    class Counted:
        shape, dtype = drawn.shape, drawn.dtype

        def __getitem__(self, index):
            read.append(index)
            return drawn[index]

    arrays = {"embed": Counted(), "count": np.array(7, np.int64), "bias": np.arange(5, dtype=np.float32),
              "empty": np.zeros((0, 3), np.float32), "flags": np.array([True, False])}
    path = tmp_path / "model.safetensors"
    save_weights(arrays, path, {"format": "pt"}, block_bytes=40 * 4 * 64)
    loaded = load_file(path)
    np.testing.assert_array_equal(loaded["embed"], np.asarray(drawn))
    assert all(np.array_equal(loaded[name], arrays[name]) and loaded[name].dtype == arrays[name].dtype
               for name in ("count", "bias", "empty", "flags"))
    with safe_open(path, framework="np") as handle:
        assert handle.metadata() == {"format": "pt"}
    assert len(read) == 5  # 300 rows, 64 at a time

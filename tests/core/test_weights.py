"""`tpuplex.models.weights`: `save_weights` writes the safetensors file the library writes, a block at a time;
`load_weights` maps such a file and reads any block of a tensor alone, bfloat16 included."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from tpuplex import initializers
from tpuplex.errors import CheckpointError
from tpuplex.models.weights import StoredTensor, load_weights, save_weights


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


def _bfloat16_file(path, values: np.ndarray) -> None:
    """A safetensors file holding `values` (float32 whose low 16 bits are zero) as one BF16 tensor "w", written by
    hand: numpy has no bfloat16 for the library to write."""
    bits = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"w": {"dtype": "BF16", "shape": list(values.shape), "data_offsets": [0, len(bits)]}})
    header += " " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header.encode() + bits)


def test_loaded_weights_are_readers_whose_blocks_equal_the_whole(tmp_path) -> None:
    rng = np.random.default_rng(0)
    arrays = {"embed": rng.standard_normal((37, 11)).astype(np.float32),
              "half": rng.standard_normal(9).astype(np.float16), "ids": np.arange(12, dtype=np.int64).reshape(3, 4),
              "scalar": np.array(2.5, np.float64),
              "empty": np.zeros((0, 4), np.float32)}
    save_file(arrays, str(tmp_path / "model.safetensors"))
    loaded = load_weights(tmp_path)
    assert all(isinstance(reader, StoredTensor) for reader in loaded.values())
    for name, array in arrays.items():
        expected = array.astype(np.float32) if np.issubdtype(array.dtype, np.floating) else array
        assert loaded[name].shape == array.shape and loaded[name].dtype == expected.dtype, name
        np.testing.assert_array_equal(np.asarray(loaded[name]), expected)
    np.testing.assert_array_equal(loaded["embed"][5:9, 2:7], arrays["embed"][5:9, 2:7])
    np.testing.assert_array_equal(loaded["ids"][1:, :], arrays["ids"][1:])
    block = loaded["embed"][0:2, :]
    block[:] = 0  # a block is the caller's own copy: the file and later reads are untouched
    np.testing.assert_array_equal(loaded["embed"][0:2, :], arrays["embed"][0:2])


def test_bfloat16_weights_widen_exactly(tmp_path) -> None:
    values = (np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32).view(np.uint32)
              & np.uint32(0xFFFF0000)).view(np.float32)
    _bfloat16_file(tmp_path / "model.safetensors", values)
    reader = load_weights(tmp_path)["w"]
    assert reader.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(reader), values)
    np.testing.assert_array_equal(reader[2:4, 1:3], values[2:4, 1:3])


@pytest.mark.parametrize(("damage", "message"), [
    (lambda path: path.write_bytes(path.read_bytes()[:12]), "cannot read the weights"),
    (lambda path: path.write_bytes(path.read_bytes().replace(b'"F32"', b'"F8_"')),
     "as F8_, which tpuplex does not read"),
])
def test_damaged_or_unknown_weights_are_refused(tmp_path, damage, message) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": np.ones((2, 3), np.float32)}, str(path))
    damage(path)
    with pytest.raises(CheckpointError, match=message):
        load_weights(tmp_path)

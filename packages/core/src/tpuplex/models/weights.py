"""A checkpoint folder's weights as numpy arrays: `model.safetensors`, or `pytorch_model.bin` read without torch;
and `save_weights`, which writes a safetensors file a block at a time (an exported model is never whole in memory).

`pytorch_model.bin` is a pickle, and unpickling runs whatever the file names. It is read here the way
`torch.load(weights_only=True)` reads it, without torch: an unpickler that resolves only a state dict's own
pieces (an OrderedDict, tensor rebuilds, storage types) and refuses every other global.
"""

from __future__ import annotations

import collections
import json
import math
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from tpuplex.errors import CheckpointError
from tpuplex.slices import SliceReader

SAFETENSORS, PICKLE = "model.safetensors", "pytorch_model.bin"

_STORAGE_DTYPES = {"FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
                   "BFloat16Storage": np.uint16, "LongStorage": np.int64, "IntStorage": np.int32,
                   "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_}


def load_weights(checkpoint_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's weights file, float tensors as float32 (bfloat16 widened exactly)."""
    folder = Path(checkpoint_dir)
    if (folder / SAFETENSORS).is_file():
        path = folder / SAFETENSORS
        try:
            arrays = load_file(path)
        except (SafetensorError, OSError, ValueError) as error:
            raise _unreadable(path, error) from None
    elif (folder / PICKLE).is_file():
        arrays = _load_pickled(folder / PICKLE)
    else:
        raise CheckpointError(f"model checkpoint {folder} has neither {SAFETENSORS} nor {PICKLE}: save the model "
                              "there (transformers: model.save_pretrained(folder))")
    return {name: array.astype(np.float32) if np.issubdtype(array.dtype, np.floating) else array
            for name, array in arrays.items()}


_SAFETENSORS_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.float16): "F16",
                       np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16",
                       np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL"}
"""numpy dtypes as the safetensors format names them."""
BLOCK_BYTES = 64 * 2**20
"""`save_weights` reads and writes an array at most this many bytes at a time (whole rows of dimension 0)."""


def save_weights(arrays: Mapping[str, SliceReader], path: Path, metadata: Mapping[str, str] | None = None,
                 block_bytes: int = BLOCK_BYTES) -> None:
    """Write `arrays` (numpy arrays or any `tpuplex.slices.SliceReader`) as the safetensors file `path`, reading
    each a block of rows at a time: the file `safetensors.numpy.save_file` writes, without holding the arrays in
    memory at once (the format is a JSON header of dtypes, shapes and byte offsets, then the bytes in order; the
    library writes only from arrays it holds)."""
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, array in arrays.items():
        dtype = np.dtype(array.dtype)
        size = math.prod(array.shape) * dtype.itemsize
        header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as the library writes it
    with open(path, "wb") as file:
        file.write(len(encoded).to_bytes(8, "little"))
        file.write(encoded)
        for array in arrays.values():
            if not array.shape:
                file.write(np.asarray(array).tobytes())
                continue
            row_bytes = max(1, math.prod(array.shape[1:]) * np.dtype(array.dtype).itemsize)
            rows = max(1, block_bytes // row_bytes)
            for first in range(0, array.shape[0], rows):
                file.write(np.ascontiguousarray(array[(slice(first, first + rows),)]).data)  # no copy to bytes


def _load_pickled(path: Path) -> dict[str, np.ndarray]:
    try:
        with zipfile.ZipFile(path) as archive:
            pickled = next((name for name in archive.namelist() if name.endswith("/data.pkl")), None)
            if pickled is None:
                raise CheckpointError(f"{path} has no data.pkl: it is not a torch.save zip archive; re-save it with "
                                      "model.save_pretrained(folder, safe_serialization=True)")
            root = pickled.removesuffix("data.pkl")
            with archive.open(pickled) as file:
                state = _WeightsUnpickler(file, archive, root).load()
    except zipfile.BadZipFile as error:
        raise _unreadable(path, error) from None
    except (pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError) as error:
        raise _unreadable(path, error) from None
    if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
        raise _unreadable(path, "it does not hold a state dict of tensors")
    return dict(state)


class _WeightsUnpickler(pickle.Unpickler):
    def __init__(self, file, archive: zipfile.ZipFile, root: str):
        super().__init__(file)
        self.archive, self.root = archive, root

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return name
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a weights-only load refuses")

    def persistent_load(self, pid):
        kind, storage_type, key, _location, _numel = pid
        if kind != "storage" or storage_type not in _STORAGE_DTYPES:
            raise pickle.UnpicklingError(f"unknown storage {storage_type!r}")
        data = np.frombuffer(self.archive.read(f"{self.root}data/{key}"), _STORAGE_DTYPES[storage_type])
        if storage_type == "BFloat16Storage":  # bfloat16 is float32's upper half: widen exactly
            data = (data.astype(np.uint32) << 16).view(np.float32)
        return data


def _rebuild_tensor(storage: np.ndarray, offset: int, size, stride, *_ignored) -> np.ndarray:
    strides = [step * storage.itemsize for step in stride]
    return np.lib.stride_tricks.as_strided(storage[offset:], tuple(size), strides).copy()


def _unreadable(path: Path, error) -> CheckpointError:
    return CheckpointError(f"cannot read the weights {path} ({error}): the file is damaged or not a weights file; "
                           "copy it again or re-save the checkpoint")

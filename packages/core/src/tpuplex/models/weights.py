"""A checkpoint folder's weights: `model.safetensors` as readers that map the file and read a block at a time (a
sharded run's process reads only the blocks its devices keep), or `pytorch_model.bin` read whole without torch;
and `save_weights`, which writes a safetensors file a block at a time (an exported model is never whole in memory).

`pytorch_model.bin` is a pickle, and unpickling runs whatever the file names. It is read here the way
`torch.load(weights_only=True)` reads it, without torch: an unpickler that resolves only a state dict's own
pieces (an OrderedDict, tensor rebuilds, storage types) and refuses every other global.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tpuplex.errors import CheckpointError
from tpuplex.slices import BlockReader, Index, SliceReader, bounds

SAFETENSORS, PICKLE = "model.safetensors", "pytorch_model.bin"

_STORAGE_DTYPES = {"FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
                   "BFloat16Storage": np.uint16, "LongStorage": np.int64, "IntStorage": np.int32,
                   "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_}


def load_weights(checkpoint_dir: Path) -> dict[str, SliceReader]:
    """Every tensor of the folder's weights file as a `StoredTensor` (mapped, read a block at a time), float
    tensors read as float32 (bfloat16 and float16 widened exactly): model.safetensors, else pytorch_model.bin.
    A block read with a NaN or an infinity in it stops the run in one line naming the tensor and the file (a backend
    reads every parameter when it builds the model, so before any step)."""
    folder = Path(checkpoint_dir)
    for name in (SAFETENSORS, PICKLE):
        if (folder / name).is_file():
            tensors = stored_tensors(folder / name) if name == SAFETENSORS else _load_pickled(folder / name)
            return {key: dataclasses.replace(tensor, name=key, path=str(folder / name))
                    for key, tensor in tensors.items()}
    raise CheckpointError(f"model checkpoint {folder} has neither {SAFETENSORS} nor {PICKLE}: save the model "
                          "there (transformers: model.save_pretrained(folder))")


SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
                      "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
"""safetensors' dtype names as the numpy dtype each is mapped as (bfloat16 as its bits, widened when read)."""


@dataclasses.dataclass(frozen=True)
class StoredTensor(BlockReader):
    """One tensor of a weights file, mapped, not read: a block reads only its own pages. Floats come out as
    float32; bfloat16 is float32's upper half, so it widens exactly by a shift."""

    stored: np.ndarray  # the tensor as the file stores it: a view of the file's memory map (strided for a torch view)
    bfloat16: bool
    name: str = ""
    """The tensor's name and its file (`load_weights`): what a block that is not finite is reported as."""
    path: str = ""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.stored.shape)

    @property
    def dtype(self) -> np.dtype:
        floating = self.bfloat16 or np.issubdtype(self.stored.dtype, np.floating)
        return np.dtype(np.float32) if floating else self.stored.dtype

    def __getitem__(self, index: Index) -> np.ndarray:
        block = self.stored[tuple(slice(*b) for b in bounds(index, self.shape))]
        if self.bfloat16:
            block = (block.astype(np.uint32) << 16).view(np.float32)
        else:
            block = np.array(block, dtype=self.dtype)  # a copy: nothing returned points into the map
        if self.name and block.dtype.kind == "f" and not np.isfinite(block).all():
            raise CheckpointError(f"{self.name} in {self.path} holds NaN or infinite values: the checkpoint is "
                                  "damaged or was saved after training diverged; use an earlier or a re-saved one")
        return block


def stored_tensors(path: Path) -> dict[str, StoredTensor]:
    """The tensors of a safetensors file (its format: an 8-byte little-endian header length, a JSON header of
    name -> dtype, shape and byte offsets into the data that follows), each mapped, none read."""
    try:
        with open(path, "rb") as file:
            length = int.from_bytes(file.read(8), "little")
            header = json.loads(file.read(length))
        data = np.memmap(path, np.uint8, mode="r", offset=8 + length) if path.stat().st_size > 8 + length else None
        tensors = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            if entry["dtype"] not in SAFETENSORS_DTYPES:
                raise CheckpointError(f"{path} stores {name} as {entry['dtype']}, which tpuplex does not read: save "
                                      f"the model in one of {', '.join(SAFETENSORS_DTYPES)}")
            dtype = np.dtype(SAFETENSORS_DTYPES[entry["dtype"]])
            stored = (data[begin:end] if end > begin else np.zeros(0, np.uint8)).view(dtype)
            tensors[name] = StoredTensor(stored.reshape(entry["shape"]), entry["dtype"] == "BF16")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise _unreadable(path, error) from None
    return tensors


_SAFETENSORS_NAMES = {np.dtype(dtype): name for name, dtype in SAFETENSORS_DTYPES.items() if name != "BF16"}
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
        header[name] = {"dtype": _SAFETENSORS_NAMES[dtype], "shape": list(array.shape),
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


def _load_pickled(path: Path) -> dict[str, StoredTensor]:
    """The tensors of a torch.save zip archive, through a weights-only unpickler (no torch), each a view of its
    storage's entry in the archive, mapped where the entry is stored uncompressed (torch.save stores every one
    so)."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickled = next((name for name in archive.namelist() if name.endswith("/data.pkl")), None)
            if pickled is None:
                raise CheckpointError(f"{path} has no data.pkl: it is not a torch.save zip archive; re-save it with "
                                      "model.save_pretrained(folder, safe_serialization=True)")
            root = pickled.removesuffix("data.pkl")
            mapped = np.memmap(path, np.uint8, mode="r")
            with archive.open(pickled) as file:
                state = _WeightsUnpickler(file, mapped, archive, root).load()
    except zipfile.BadZipFile as error:
        raise _unreadable(path, error) from None
    except (pickle.UnpicklingError, EOFError, KeyError, ValueError, TypeError, OSError) as error:
        raise _unreadable(path, error) from None
    if not isinstance(state, dict) or not all(isinstance(v, StoredTensor) for v in state.values()):
        raise _unreadable(path, "it does not hold a state dict of tensors")
    return dict(state)


class _Storage(NamedTuple):
    data: np.ndarray  # flat, as stored (bfloat16 as its bits)
    bfloat16: bool


class _WeightsUnpickler(pickle.Unpickler):
    def __init__(self, file, mapped: np.ndarray, archive: zipfile.ZipFile, root: str):
        super().__init__(file)
        self.mapped, self.archive, self.root = mapped, archive, root  # mapped: the whole archive's bytes

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
        dtype = np.dtype(_STORAGE_DTYPES[storage_type])
        info = self.archive.getinfo(f"{self.root}data/{key}")
        if info.compress_type == zipfile.ZIP_STORED:
            start = _data_offset(self.mapped, info)
            data = self.mapped[start : start + info.file_size].view(dtype)
        else:  # an archive zipped again: the entry is read whole
            data = np.frombuffer(self.archive.read(info), dtype)
        return _Storage(data, storage_type == "BFloat16Storage")


def _data_offset(mapped: np.ndarray, info: zipfile.ZipInfo) -> int:
    """Where an uncompressed entry's bytes start in the archive `mapped`: after its local header (30 bytes, then
    its name and extra field, whose lengths the header's last four bytes give)."""
    local = bytes(mapped[info.header_offset : info.header_offset + 30])
    if local[:4] != b"PK\x03\x04":
        raise ValueError(f"no local header for {info.filename}")
    return info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")


def _rebuild_tensor(storage: _Storage, offset: int, size, stride, *_ignored) -> StoredTensor:
    """torch's tensor of `size` and `stride` (in elements) from `offset` of its storage, as a view of it."""
    size, stride = tuple(size), tuple(stride)
    last = offset + sum((length - 1) * step for length, step in zip(size, stride, strict=True))
    if any(step < 0 for step in stride) or (all(size) and not 0 <= offset <= last < len(storage.data)):
        raise pickle.UnpicklingError("a tensor reaches past its storage")
    strides = [step * storage.data.itemsize for step in stride]
    view = np.lib.stride_tricks.as_strided(storage.data[offset:], size, strides, writeable=False)
    return StoredTensor(view, storage.bfloat16)


def _unreadable(path: Path, error) -> CheckpointError:
    return CheckpointError(f"cannot read the weights {path} ({error}): the file is damaged or not a weights file; "
                           "copy it again or re-save the checkpoint")

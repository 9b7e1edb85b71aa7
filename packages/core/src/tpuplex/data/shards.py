"""Prepared shards: the one on-disk format every task's data is read from, lazily, record by record.

A prepared split is a folder, local or at any fsspec URL (`gs://` through gcsfs when it is installed):

    manifest.json          the record layout (each field's dtype and per-row shape), the row count, every shard
                           (rows, bytes, sha256), the per-row columns, and what the task recorded (`meta`)
    records-00000.bin      fixed-size records: one row's fields, little-endian, in layout order, then the CRC-32
                           of those bytes (uint32)
    lengths-00000.npy      small per-row columns (`columns`: token counts, labels) for plans that need every row's
                           value (length buckets, a stratified hold-out), read whole only when asked for

Row i of a shard is bytes [i * R, (i + 1) * R) with R the record size, so a run computes where any row lives from
the manifest alone: the seeded order of an epoch, each process's rows and the resume position need no index, and
each process reads exactly the records of its own rows (`Shards.read`, by byte range: `os.pread` on local files,
one `cat_ranges` call per batch elsewhere). Every record is checked against its CRC as it is read (riegeli's and
ArrayRecord's per-chunk checks, at the grain of a row) and every shard's size when it is first opened; a damaged or
missing shard stops the run with one line naming it. Transient read errors (`OSError` other than a missing file)
are retried with backoff.

Why not ArrayRecord, Arrow or TFRecord: ArrayRecord's reader is C++ over local files (no fsspec), an Arrow IPC file
is read a record batch at a time (a process would read every batch its rows fall in), and TFRecord has no random
access. Fixed-size rows cost padding (text rows to max_length: what the in-memory arrays held anyway) and buy
addressing by arithmetic. A folder is written under a temporary name and renamed into place when complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import time
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tpuplex.errors import DataError

FORMAT = "tpuplex-shards"
VERSION = 1
MANIFEST = "manifest.json"
OPEN_FILES = 64
RETRIES = 4
"""Attempts after the first for a read that fails with a transient error (waits 0.1, 0.2, 0.4, 0.8 s)."""
STAGING_MARK = ".tpuplex-staging"
"""In a writer's staging folder: only a folder holding it is ever removed as abandoned."""


@dataclasses.dataclass(frozen=True)
class Field:
    """One per-row field of a record: `dtype` and the row's `shape` (() for a scalar)."""

    dtype: str
    shape: tuple[int, ...] = ()


def record_dtype(fields: Mapping[str, Field]) -> np.dtype:
    """The packed numpy dtype of one record: the fields little-endian in order, then `crc` (uint32)."""
    layout = [(name, np.dtype(field.dtype).newbyteorder("<"), field.shape) for name, field in fields.items()]
    return np.dtype([*layout, ("crc", "<u4")])


@dataclasses.dataclass
class ReadStats:
    """What a Shards object has read: records and bytes (record bytes, CRCs included), and retried errors."""

    record_bytes: int
    records: int = 0
    bytes: int = 0
    retried: int = 0


class ShardWriter:
    """Writes a prepared folder: `add` rows in order, then `close` (or leave the `with` block) to publish it.

    fields: name -> Field (the records); columns: names of fields also written whole per shard (small per-row
    values a plan needs for every row); meta: what the task records (its fingerprint, classes, max_length...).
    """

    def __init__(self, folder: str | Path, fields: Mapping[str, Field], columns: Iterable[str] = (),
                 meta: Mapping[str, Any] | None = None, shard_rows: int = 65536):
        if shard_rows < 1:
            raise DataError(f"shard size {shard_rows}: use 1 or more rows per shard")
        self.folder = Path(folder).expanduser()
        if self.folder.exists():
            raise DataError(f"{self.folder} already exists: choose a new folder for the prepared data (or "
                            "remove it)")
        self.fields = dict(fields)
        self.columns = tuple(columns)
        self.meta = dict(meta or {})
        self.shard_rows = shard_rows
        self.dtype = record_dtype(self.fields)
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned(self.folder)
        self.staging = Path(tempfile.mkdtemp(prefix=f".{self.folder.name}.partial-{os.getpid()}-",
                                             dir=self.folder.parent))
        (self.staging / STAGING_MARK).write_text(str(os.getpid()))
        self.shards: list[dict[str, Any]] = []
        self._file: Any = None
        self._digest = hashlib.sha256()
        self._rows = 0
        self._column_parts: dict[str, list[np.ndarray]] = {}

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is None:
            self.close()
        else:
            self.abandon()

    def add(self, **arrays: np.ndarray) -> None:
        """Append rows: every field as an array [n, *shape] (cast to the field's dtype). Records go straight to
        the current shard's file; a shard holds `shard_rows` rows."""
        if set(arrays) != set(self.fields):
            raise ValueError(f"rows with fields {sorted(arrays)}, the layout has {sorted(self.fields)}")
        count = len(next(iter(arrays.values())))
        records = np.zeros(count, self.dtype)
        for name, values in arrays.items():
            records[name] = values
        payload = records.view(np.uint8).reshape(count, self.dtype.itemsize)[:, :-4]
        records["crc"] = [zlib.crc32(row) for row in payload]
        while len(records):
            if self._file is None:
                self._file = (self.staging / f"records-{len(self.shards):05d}.bin").open("wb")
            part, records = records[: self.shard_rows - self._rows], records[self.shard_rows - self._rows :]
            self._file.write(part.tobytes())
            self._digest.update(part.tobytes())
            self._rows += len(part)
            for column in self.columns:
                self._column_parts.setdefault(column, []).append(np.ascontiguousarray(part[column]))
            if self._rows == self.shard_rows:
                self._finish_shard()

    def _finish_shard(self) -> None:
        self._file.close()
        name = f"{len(self.shards):05d}"
        entry = {"records": f"records-{name}.bin", "rows": self._rows, "bytes": self._rows * self.dtype.itemsize,
                 "sha256": self._digest.hexdigest()}
        for column in self.columns:
            entry[column] = f"{column}-{name}.npy"
            np.save(self.staging / entry[column], np.concatenate(self._column_parts.pop(column)))
        self.shards.append(entry)
        self._file, self._digest, self._rows = None, hashlib.sha256(), 0

    def close(self) -> dict[str, Any]:
        """Finish the last shard, write the manifest, and rename the folder into place; returns the manifest."""
        try:
            if self._file is not None:
                self._finish_shard()
            if not self.shards:
                raise DataError(f"nothing to prepare into {self.folder}: the data has no rows")
            content = hashlib.sha256("".join(shard["sha256"] for shard in self.shards).encode())
            manifest = {"format": FORMAT, "version": VERSION,
                        "fields": {name: {"dtype": field.dtype, "shape": list(field.shape)}
                                   for name, field in self.fields.items()},
                        "columns": list(self.columns), "record_bytes": self.dtype.itemsize,
                        "rows": sum(shard["rows"] for shard in self.shards), "shards": self.shards,
                        "content_sha256": content.hexdigest(), "meta": self.meta,
                        "meta_sha256": meta_sha256(self.meta)}
            (self.staging / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
            (self.staging / STAGING_MARK).unlink()
            os.replace(self.staging, self.folder)
        except BaseException:
            self.abandon()
            raise
        return manifest

    def abandon(self) -> None:
        """Delete what was written (nothing is published)."""
        if self._file is not None:
            self._file.close()
        shutil.rmtree(self.staging, ignore_errors=True)


def remove_abandoned(folder: Path) -> None:
    """Delete what a killed writer of `folder` left: the staging folders a writer made (their exact name form and
    its mark inside) whose process is gone (a live one may be another writer of the same folder at work). A user's
    folder of a similar name (`.corpus.partial-old`) is never touched."""
    for staging in folder.parent.glob(f".{folder.name}.partial-*"):
        found = re.fullmatch(r"(\d+)-[a-z0-9_]{8}", staging.name.removeprefix(f".{folder.name}.partial-"))
        if found and (staging / STAGING_MARK).is_file() and not _alive(int(found.group(1))):
            shutil.rmtree(staging, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (signal 0 tests it without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_prepared(location: str | Path) -> bool:
    """Whether `location` (a path or an fsspec URL) holds a prepared folder's manifest."""
    filesystem, root = _filesystem(location)
    try:
        return filesystem.isfile(_join(root, MANIFEST))
    except OSError:
        return False


def open_shards(location: str | Path, retries: int = RETRIES) -> Shards:
    """The prepared folder at `location` (a local path or an fsspec URL), its manifest read and checked."""
    filesystem, root = _filesystem(location)
    if not is_prepared(location):
        raise DataError(f"{location} is not a prepared folder (no {MANIFEST}): run tpuplex prepare first")
    try:
        manifest = json.loads(_retrying(lambda: filesystem.cat_file(_join(root, MANIFEST)), retries,
                                        f"{location}/{MANIFEST}"))
    except (ValueError, UnicodeDecodeError):
        raise DataError(f"{location}/{MANIFEST} is damaged (not JSON): run tpuplex prepare again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        found = manifest if isinstance(manifest, dict) else {}
        raise DataError(f"{location} holds {found.get('format')} version {found.get('version')}, this "
                        f"tpuplex reads {FORMAT} version {VERSION}: run tpuplex prepare again")
    problem = manifest_problem(manifest)
    if problem:
        raise DataError(f"{location}/{MANIFEST} does not describe its shards ({problem}): run tpuplex prepare "
                        "again, or restore the folder as prepare wrote it")
    return Shards(str(location), manifest, filesystem, root, retries)


def meta_sha256(meta: Mapping[str, Any]) -> str:
    """The hash of a manifest's `meta` (what the task recorded: classes, tokenizer), so an edit shows."""
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


def manifest_problem(manifest: Mapping[str, Any]) -> str:
    """What makes `manifest` disagree with itself ("" when nothing): a missing entry, row counts that do not add
    up, a shard whose bytes are not its rows' records, a record size that is not its fields', edited `meta`."""
    for key, kind in (("fields", dict), ("columns", list), ("record_bytes", int), ("rows", int), ("shards", list),
                      ("content_sha256", str), ("meta", dict)):
        if not isinstance(manifest.get(key), kind):
            return f"its {key!r} entry is missing or not a {kind.__name__}"
    try:
        fields = {name: Field(spec["dtype"], tuple(spec["shape"])) for name, spec in manifest["fields"].items()}
        record_bytes = record_dtype(fields).itemsize
        shard_rows = [int(shard["rows"]) for shard in manifest["shards"]]
        shard_bytes = [int(shard["bytes"]) for shard in manifest["shards"]]
        missing = next((name for shard in manifest["shards"] for name in ("records", "sha256", *manifest["columns"])
                        if not isinstance(shard.get(name), str)), None)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        return f"its fields or shards are unreadable ({type(error).__name__}: {error})"
    if missing is not None:
        return f"a shard names no {missing!r} file"
    if record_bytes != manifest["record_bytes"]:
        return f"records of its fields are {record_bytes} bytes, it says {manifest['record_bytes']}"
    if sum(shard_rows) != manifest["rows"]:
        return f"its shards hold {sum(shard_rows)} rows, it says {manifest['rows']}"
    wrong = next((index for index, (rows, size) in enumerate(zip(shard_rows, shard_bytes, strict=True))
                  if rows < 0 or rows * record_bytes != size), None)
    if wrong is not None:
        return f"shard {wrong} holds {shard_bytes[wrong]} bytes, not {shard_rows[wrong]} records of {record_bytes}"
    if "meta_sha256" in manifest and manifest["meta_sha256"] != meta_sha256(manifest["meta"]):
        return "its meta was edited"
    return ""


class Shards:
    """A prepared folder read lazily: `read(rows)` reads those records only; `column(name)` a per-row column.

    stats counts what was read, so a test or a benchmark can show that a process read its own rows and no others.
    """

    def __init__(self, location: str, manifest: dict[str, Any], filesystem: Any, root: str, retries: int):
        self.location = location
        self.manifest = manifest
        self.fields = {name: Field(spec["dtype"], tuple(spec["shape"])) for name, spec in manifest["fields"].items()}
        self.dtype = record_dtype(self.fields)
        self.meta: dict[str, Any] = manifest["meta"]
        self.stats = ReadStats(self.dtype.itemsize)
        self._filesystem, self._root, self._retries = filesystem, root, retries
        from fsspec.implementations.local import LocalFileSystem

        self._local = isinstance(filesystem, LocalFileSystem)
        self._descriptors: dict[int, int] = {}
        self._checked: set[int] = set()
        self._column_cache: dict[str, np.ndarray] = {}
        self.offsets = np.cumsum([0] + [shard["rows"] for shard in manifest["shards"]])
        """int64 [shards + 1]: the global index of each shard's first row, then the row count."""

    def __len__(self) -> int:
        return int(self.manifest["rows"])

    def fingerprint(self) -> str:
        return self.manifest["content_sha256"][:16]

    def reopened(self) -> Shards:
        """The same folder with a reader of its own (its own files and counts)."""
        return Shards(self.location, self.manifest, self._filesystem, self._root, self._retries)

    def column(self, name: str) -> np.ndarray:
        """A per-row column of every row, in order ([N], the field's dtype), read once from the shards' column
        files."""
        if name not in self._column_cache:
            if name not in self.manifest["columns"]:
                raise KeyError(f"{self.location} has no column {name!r} (it has {self.manifest['columns']})")
            parts = []
            for shard in self.manifest["shards"]:
                path = self._path(shard[name])
                data = self._read_retrying(lambda path=path: self._filesystem.cat_file(path), shard[name])
                parts.append(np.load(io.BytesIO(data), allow_pickle=False))
                if len(parts[-1]) != shard["rows"]:
                    raise DataError(f"prepared column {path} is damaged: {len(parts[-1])} rows, its manifest says "
                                    f"{shard['rows']}; run tpuplex prepare again (or restore the folder)")
            self._column_cache[name] = np.concatenate(parts)
        return self._column_cache[name]

    def read(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Each field's values at global rows `rows` (int [n], any order, repeats allowed): [n, *shape]."""
        rows = np.asarray(rows, np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"rows outside [0, {len(self)}) of {self.location}")
        unique, inverse = np.unique(rows, return_inverse=True)
        records = np.empty(len(unique), self.dtype)
        shard_of = np.searchsorted(self.offsets, unique, side="right") - 1
        for shard in np.unique(shard_of):
            chosen = np.flatnonzero(shard_of == shard)
            records[chosen] = self._records(int(shard), unique[chosen] - self.offsets[shard])
        return {name: records[name][inverse] for name in self.fields}

    def _records(self, shard: int, rows: np.ndarray) -> np.ndarray:
        """The records at sorted, distinct rows `rows` of shard `shard`, their CRCs checked (a mismatch is read
        once more, in case the read itself was torn, before it is reported)."""
        size = self.dtype.itemsize
        # Consecutive rows become one range.
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        starts = rows[np.concatenate([[0], breaks])]
        ends = rows[np.concatenate([breaks - 1, [len(rows) - 1]])] + 1
        name = self.manifest["shards"][shard]["records"]
        for attempt in range(2):
            blobs = self._ranges(shard, starts * size, ends * size)
            records = np.frombuffer(b"".join(blobs), self.dtype)
            payload = records.view(np.uint8).reshape(len(records), size)[:, :-4]
            bad = [row for row, crc in enumerate(records["crc"]) if zlib.crc32(payload[row]) != crc]
            self.stats.records += len(records)
            self.stats.bytes += records.nbytes
            if not bad:
                return records
            if attempt == 0:
                self.stats.retried += 1
        raise DataError(f"prepared shard {self._path(name)} is damaged: record {int(rows[bad[0]])} fails its "
                        "checksum; run tpuplex prepare again (or restore the shard from a copy)")

    def _ranges(self, shard: int, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
        """Bytes [start, end) of a shard for each range: one pread each on a local file, one `cat_ranges` request
        elsewhere (gcsfs fetches them concurrently); each read retried on a transient error."""
        name = self.manifest["shards"][shard]["records"]
        self._read_retrying(lambda: self._check_size(shard), name)
        if self._local:
            return [self._read_retrying(lambda start=start, end=end: os.pread(self._descriptor(shard),
                                                                              int(end - start), int(start)), name)
                    for start, end in zip(starts, ends, strict=True)]
        path = self._path(name)
        return self._read_retrying(
            lambda: self._filesystem.cat_ranges([path] * len(starts), starts.tolist(), ends.tolist()), name)

    def _descriptor(self, shard: int) -> int:
        """An open file of the shard; the least recently opened is closed beyond OPEN_FILES (a corpus may have
        more shards than a process may open files)."""
        if shard not in self._descriptors:
            if len(self._descriptors) >= OPEN_FILES:
                os.close(self._descriptors.pop(next(iter(self._descriptors))))
            self._descriptors[shard] = os.open(self._path(self.manifest["shards"][shard]["records"]), os.O_RDONLY)
        return self._descriptors[shard]

    def _check_size(self, shard: int) -> None:
        """A shard's size, once: a truncated or extended file is damaged."""
        if shard in self._checked:
            return
        entry = self.manifest["shards"][shard]
        size = self._filesystem.size(self._path(entry["records"]))
        if size != entry["bytes"]:
            raise DataError(f"prepared shard {self._path(entry['records'])} is damaged: {size} bytes, its "
                            f"manifest says {entry['bytes']}; run tpuplex prepare again (or restore the shard)")
        self._checked.add(shard)

    def _read_retrying(self, read, name: str):
        return _retrying(read, self._retries, self._path(name), self.stats)

    def _path(self, name: str) -> str:
        return _join(self._root, name)


def _retrying(read, retries: int, what: str, stats: ReadStats | None = None):
    """`read()`, tried again after a transient OSError (up to `retries` times, backing off); a missing file or a
    last failure becomes one TpuplexError naming `what`."""
    for attempt in range(retries + 1):
        try:
            return read()
        except FileNotFoundError:
            raise DataError(f"prepared shard {what} is missing: run tpuplex prepare again (or restore it)") \
                from None
        except OSError as error:
            if attempt == retries:
                raise DataError(f"cannot read {what} after {retries + 1} attempts ({error}): check the storage "
                                "and run again; the run resumes from its last checkpoint") from None
            if stats is not None:
                stats.retried += 1
            time.sleep(0.1 * 2**attempt)
    raise AssertionError("unreachable")


def _filesystem(location: str | Path) -> tuple[Any, str]:
    import fsspec  # imported here: only prepared data needs it

    filesystem, root = fsspec.core.url_to_fs(str(Path(location).expanduser()) if isinstance(location, Path)
                                             else str(location))
    return filesystem, root


def _join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}"

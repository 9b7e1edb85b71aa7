"""A pre-training corpus of any size, tokenized and packed into prepared shards by worker processes.

    tpuplex prepare "corpus/*.txt" --out data/corpus-L128 --tokenizer CHECKPOINT --max-length 128 --workers 2
        [--task causal_lm]

The files (a glob of `.txt` and `.jsonl` files with a text field; local or any fsspec URL) are cut into units of
about `unit_bytes` at line boundaries: unit (file, start, end) holds the lines that begin in bytes [start, end), so
no file is ever read whole. The task's `DocumentEncoder` says what a document is (a .jsonl line's text; a .txt
file's non-blank line, or the whole file with its lines as they are) and tokenizes units of them. Worker processes
tokenize units (each worker one thread: the workers are the parallelism) and each writes its unit's token ids to
the work folder `<out>.partial/`; the main process then concatenates the units' tokens in order and cuts rows of
max_length, as the task packs a corpus in memory, so the shards equal what the in-memory path packs, bit for bit.

An interrupted `prepare` (a kill, a full disk) keeps the units it finished: the same command continues with the
others. The work folder records what the units were cut from (the files' sizes and modification times, the
tokenizer, max_length), and is started afresh when any of it changed.

`documents = (first, stop)` keeps only the corpus's documents [first, stop) in reading order (a run's held-out
share); a counting pass over the units finds where each unit's documents start. `cached_corpus` is how a run reads
a raw .txt/.jsonl corpus: through this same code into the token cache, so a run's memory does not grow with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import multiprocessing
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tpuplex.data.batching import Encoded
from tpuplex.data.prepared_tokens import PreparedTokens, open_tokens, write_tokens
from tpuplex.data.progress import Progress
from tpuplex.data.shards import is_prepared
from tpuplex.data.tokenize import PAD_ID
from tpuplex.errors import DataError

UNIT_BYTES = 16 << 20
WORK_FORMAT = 2
WORK_TOOL = "tpuplex prepare"
SUFFIXES = (".txt", ".jsonl")


class DocumentEncoder(Protocol):
    """A task's way with a corpus (picklable: each worker process gets a copy).

    whole_files: a .txt file is one document, its lines as they are (else each non-blank line is one, stripped);
    record: what the work plan and the prepared manifest note (the task, a hash of the tokenizer's files, ...): a
    prepared corpus is read only by a run that would have made the same.
    """

    whole_files: bool

    @property
    def record(self) -> dict[str, Any]: ...

    def check(self) -> None:
        """Raise one clear TpuplexError before any worker starts (a tokenizer that cannot be read...)."""

    def encode(self, documents: list[str], ends: list[bool]) -> np.ndarray:
        """int32 [tokens]: the documents' ids concatenated; ends[i]: documents[i] ends a document (under
        whole_files, only a file's last unit does)."""


@dataclasses.dataclass(frozen=True)
class Unit:
    """The lines of `path` that begin in bytes [start, end)."""

    path: str
    start: int
    end: int


@dataclasses.dataclass(frozen=True)
class CorpusReport:
    """What `prepare_corpus` did: the prepared split, its tokens, the units (and those found done), and the worker
    processes it used (no more than the units or the cores)."""

    prepared: PreparedTokens
    tokens: int
    units: int
    resumed_units: int
    workers: int


def corpus_files(pattern: str) -> tuple[Any, list[str]]:
    """(filesystem, sorted paths) of the .txt/.jsonl files `pattern` (a glob, a file or a folder) names."""
    import fsspec

    filesystem, root = fsspec.core.url_to_fs(pattern)
    if filesystem.isdir(root):
        root = root.rstrip("/") + "/**"
    paths = sorted(path for path in filesystem.glob(root) if path.endswith(SUFFIXES) and filesystem.isfile(path))
    if not paths:
        raise DataError(f"{pattern} names no {' or '.join(SUFFIXES)} file: give a glob such as 'corpus/*.txt'")
    return filesystem, paths


def units_of(filesystem: Any, paths: list[str], unit_bytes: int) -> list[Unit]:
    """Each file cut into units of `unit_bytes` (the last of a file shorter); an empty file gives none."""
    units = []
    for path in paths:
        size = filesystem.size(path)
        units += [Unit(path, start, min(start + unit_bytes, size)) for start in range(0, size, unit_bytes)]
    return units


def unit_documents(filesystem: Any, unit: Unit, text_column: str, whole_files: bool) -> list[str]:
    """The non-blank documents of the lines that begin in the unit, as the task's in-memory reader takes them:
    stripped, or under `whole_files` as they are (and a .txt unit's text whole)."""
    with filesystem.open(unit.path, "rb") as handle:
        begin = unit.start
        if begin > 0:  # the line that crosses `start` belongs to the unit before
            handle.seek(begin - 1)
            begin += len(handle.readline()) - 1
        handle.seek(begin)
        raw = bytearray()
        while begin + len(raw) < unit.end:
            line = handle.readline()
            if not line:
                break
            raw += line
    try:
        text = bytes(raw).decode("utf-8-sig" if begin == 0 else "utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{unit.path} is not UTF-8 text (byte 0x{raw[error.start]:02x} at offset "
                        f"{begin + error.start}): save it as UTF-8, e.g. iconv -f latin1 -t utf-8") from None
    if whole_files and not unit.path.endswith(".jsonl"):
        return [text]
    if unit.path.endswith(".jsonl"):
        texts = []
        for number, line in enumerate(text.splitlines()):
            if line.strip():
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(f"{unit.path}: line {number + 1} after byte {begin} is not JSON ({error.msg})"
                                    ": give one JSON object per line") from None
                texts.append(_record_text(value, text_column, f"{unit.path}: line {number + 1} after byte {begin}"))
    else:
        texts = text.splitlines()
    return [document if whole_files else document.strip() for document in texts if document.strip()]


def _record_text(record: Any, text_column: str, where: str) -> str:
    """The text of a .jsonl record: its `text_column`, which must be there and be text (a record without it, or
    with a list or a number there, would otherwise train on nothing or on its Python spelling)."""
    if not isinstance(record, dict) or text_column not in record:
        keys = ", ".join(map(repr, list(record)[:5])) if isinstance(record, dict) else type(record).__name__
        raise DataError(f"{where} has no {text_column!r} field (it has {keys or 'none'}): set task.text_column to "
                        "the field that holds each record's text, or give every record one")
    value = record[text_column]
    if value is not None and not isinstance(value, str):
        raise DataError(f"{where}: its {text_column!r} is a {type(value).__name__}, not text: give each record's "
                        f"{text_column} as a string")
    return value or ""


def document_count(pattern: str, encoder: DocumentEncoder, text_column: str = "text",
                   unit_bytes: int = UNIT_BYTES) -> int:
    """How many documents the corpus `pattern` holds, as `encoder` reads it (one streaming pass)."""
    filesystem, paths = corpus_files(pattern)
    return sum(_unit_counts(filesystem, units_of(filesystem, paths, unit_bytes), text_column, encoder))


def _unit_counts(filesystem: Any, units: list[Unit], text_column: str, encoder: DocumentEncoder) -> list[int]:
    """Each unit's documents. A run counts a corpus, then prepares two shares of it: one pass serves all three."""
    versions = tuple((path, filesystem.size(path), str(filesystem.modified(path)))
                     for path in dict.fromkeys(unit.path for unit in units))
    return list(_counted(filesystem, tuple(units), versions, text_column, encoder.whole_files))


@functools.lru_cache(maxsize=8)
def _counted(filesystem: Any, units: tuple[Unit, ...], versions: tuple, text_column: str,
             whole_files: bool) -> tuple[int, ...]:
    """`_unit_counts` of the files as they are at `versions` (path, size, modification time)."""
    return tuple(len(unit_documents(filesystem, unit, text_column, whole_files)) for unit in units)


def cached_corpus(pattern: str, cache_dir: Path, name: str, fingerprint: str, encoder: DocumentEncoder,
                  max_length: int, text_column: str = "text", documents: tuple[int, int] | None = None,
                  workers: int | None = None) -> PreparedTokens:
    """The corpus `pattern` (its content's `fingerprint`) prepared into the cache folder `cache_dir`, once: the
    folder `<name>-L<max_length>-<key>`, built by one process at a time (a lock file beside it; the others wait and
    read it), resumable as `prepare` is."""
    key = hashlib.sha256(json.dumps([WORK_FORMAT, fingerprint, encoder.record, max_length, text_column,
                                     documents]).encode()).hexdigest()[:20]
    final = Path(cache_dir).expanduser() / f"{name}-L{max_length}-{key}"
    if not is_prepared(final):
        final.parent.mkdir(parents=True, exist_ok=True)
        with open(final.with_name(f"{final.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not is_prepared(final):
                building = final.with_name(f"{final.name}.building")
                if not is_prepared(building):
                    prepare_corpus(pattern, building, encoder, max_length, workers or os.cpu_count() or 1,
                                   text_column, documents=documents)
                os.replace(building, final)
    return open_tokens(final)


def prepare_corpus(pattern: str, out: str | Path, encoder: DocumentEncoder, max_length: int, workers: int = 1,
                   text_column: str = "text", unit_bytes: int = UNIT_BYTES, shard_rows: int = 65536,
                   documents: tuple[int, int] | None = None) -> CorpusReport:
    """Tokenize (with the task's `encoder`) and pack the corpus `pattern` (its documents [first, stop) when
    `documents` is given) into the prepared folder `out` (see the module)."""
    out = Path(out).expanduser()
    if out.exists():
        raise DataError(f"{out} already exists: choose a new folder for the prepared corpus (or remove it)")
    if workers < 1:
        raise DataError(f"--workers {workers}: use 1 or more worker processes")
    encoder.check()
    filesystem, paths = corpus_files(pattern)
    units = units_of(filesystem, paths, unit_bytes)
    plan = {"tool": WORK_TOOL, "format": WORK_FORMAT, "max_length": max_length, "text_column": text_column,
            "unit_bytes": unit_bytes, "encoder": encoder.record, "documents": documents,
            "files": [[path, filesystem.size(path), str(filesystem.modified(path))] for path in paths]}
    work = out.with_name(f"{out.name}.partial")
    if work.exists():
        earlier = _work_plan(work)
        if earlier is None:
            raise DataError(f"{work} exists and is no unfinished `tpuplex prepare` of {out} (no plan.json of "
                            "tpuplex's in it): move it away or choose another --out; tpuplex removes only its own "
                            "work folders")
        if earlier != plan:  # ours, of another plan: nothing in it can be reused
            _remove_work(work)
    work.mkdir(parents=True, exist_ok=True)  # a file of yours left in it keeps the folder
    (work / "plan.json").write_text(json.dumps(plan))
    pending = [index for index in range(len(units)) if not _unit_file(work, index).is_file()]
    # More processes than units left, or than cores, would only start interpreters that wait.
    workers = max(1, min(workers, len(pending), os.cpu_count() or 1))
    sizes = {path: filesystem.size(path) for path in paths}
    # Each unit's documents as global indices [first, first + count), clipped to `documents`.
    firsts = np.cumsum([0, *_unit_counts(filesystem, units, text_column, encoder)])[:-1] if documents else None
    arguments = [(pattern, units[index], units[index].end == sizes[units[index].path], _unit_file(work, index),
                  encoder, text_column, None if documents is None else (documents[0] - int(firsts[index]),
                                                                        documents[1] - int(firsts[index])))
                 for index in pending]
    progress = Progress(f"tokenizing {pattern}", "parts", total=len(arguments))
    if workers == 1:  # nothing to share out: no interpreters to start
        for unit_arguments in arguments:
            _tokenize_unit(unit_arguments)
            progress.advance()
    else:
        context = multiprocessing.get_context("spawn")  # no inherited threads (tokenizers', a backend's)
        with context.Pool(workers, initializer=_single_threaded) as pool:
            for _ in pool.imap_unordered(_tokenize_unit, arguments):
                progress.advance()
    progress.close()
    tokens = sum(int(np.load(_unit_file(work, index), mmap_mode="r").shape[0]) for index in range(len(units)))
    if not tokens:
        raise DataError(f"{pattern} has no text: give a file with at least one non-blank line")
    if tokens < max_length:
        raise DataError(f"{pattern} gives {tokens} tokens, fewer than one row of data.max_length = {max_length} "
                        "(tpuplex prepare's --max-length): give more text or a lower one")
    prepared = write_tokens(out, _packed_rows(work, len(units), max_length), shard_rows=shard_rows,
                            meta={"packed": True, **encoder.record, "sources": pattern})
    _remove_work(work)
    return CorpusReport(prepared, tokens, len(units), len(units) - len(pending), workers)


def _unit_file(work: Path, index: int) -> Path:
    return work / f"unit-{index:07d}.npy"


def _work_plan(work: Path) -> dict[str, Any] | None:
    """The plan of `prepare`'s work folder `work`, or None when it holds none of tpuplex's (a folder of yours)."""
    try:
        plan = json.loads((work / "plan.json").read_text())
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) and plan.get("tool") == WORK_TOOL else None


def _remove_work(work: Path) -> None:
    """Delete the files `prepare` wrote in `work` (its plan and unit files) and the folder once empty: anything
    else found there is left where it is."""
    for path in work.glob("unit-*.npy"):
        if re.fullmatch(r"unit-\d{7}\.npy", path.name):
            path.unlink()
    (work / "plan.json").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        work.rmdir()


def _single_threaded() -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _tokenize_unit(arguments: tuple) -> None:
    """A worker's job: the unit's documents tokenized by the task's encoder, their ids concatenated and saved as
    int32 [tokens] under a temporary name, then renamed into place (a killed worker leaves no unit)."""
    pattern, unit, closes_file, path, encoder, text_column, kept = arguments
    import fsspec

    filesystem, _ = fsspec.core.url_to_fs(pattern)
    whole = encoder.whole_files and unit.path.endswith(".txt")
    documents = unit_documents(filesystem, unit, text_column, encoder.whole_files)
    if kept is not None:  # this unit's share of the documents [first, stop), relative to its first document
        documents = documents[max(0, kept[0]) : max(0, kept[1])]
    flat = encoder.encode(documents, [closes_file or not whole] * len(documents))
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with staging.open("wb") as handle:
        np.save(handle, flat)
    os.replace(staging, path)


def _packed_rows(work: Path, units: int, max_length: int, rows_per_chunk: int = 4096) -> Iterator[Encoded]:
    """The units' tokens concatenated in order and cut into rows of max_length (the last row shorter, padded with
    PAD_ID), in chunks of at most `rows_per_chunk` rows: `pack_stream`, streamed one unit at a time."""
    carry = np.zeros(0, np.int32)
    for index in range(units):
        carry = np.concatenate([carry, np.load(_unit_file(work, index))])
        full = len(carry) // max_length
        for begin in range(0, full, rows_per_chunk):
            rows = min(rows_per_chunk, full - begin)
            yield pack_stream(carry[begin * max_length : (begin + rows) * max_length], max_length)
        carry = carry[full * max_length :]
    if len(carry):
        yield pack_stream(carry, max_length)


def pack_stream(ids: np.ndarray, max_length: int) -> Encoded:
    """The token stream ids [T] cut into rows of max_length, the last one shorter (padded with PAD_ID)."""
    rows = -(-len(ids) // max_length)
    lengths = np.full(rows, max_length, np.int32)
    lengths[-1] = len(ids) - (rows - 1) * max_length
    input_ids = np.full(rows * max_length, PAD_ID, np.int32)
    input_ids[: len(ids)] = ids
    input_ids = input_ids.reshape(rows, max_length)
    return Encoded(input_ids, np.zeros_like(input_ids), lengths, np.zeros(rows, np.int32))

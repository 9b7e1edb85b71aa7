"""Users' text files (configs, data): UTF-8, a BOM allowed, or one error naming the line of the first bad byte;
tables read by the csv module with no limit on a field's length. And tpuplex's own outputs: written whole or not at
all (`staged_text`), with the permissions the user's umask gives a new file (`as_umask_allows`)."""

from __future__ import annotations

import codecs
import contextlib
import csv
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from tpuplex.errors import DataError


def read_utf8(path: Path) -> str:
    """The file's text; a TpuplexError names the line of the first byte that is not UTF-8."""
    # The mark taken off first: utf-8-sig would count an error's position from after it.
    raw = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataError(f"{path} is not UTF-8 text (byte 0x{raw[error.start]:02x} on line {line}): save it as "
                        "UTF-8, e.g. iconv -f latin1 -t utf-8") from None


CSV_FIELD_LIMIT = 2**31 - 1
"""A field as long as a C long allows (the csv module's default is 131,072 characters): a long document is a text,
not an error. A quote never closed still shows, as a row with too few fields."""


def csv_reader(lines: Iterable[str], **options: Any) -> Any:
    """`csv.reader(lines, **options)` with fields up to CSV_FIELD_LIMIT characters."""
    csv.field_size_limit(CSV_FIELD_LIMIT)
    return csv.reader(lines, **options)


def as_umask_allows(path: Path) -> Path:
    """Give a file (rw) or folder (rwx) written through `tempfile`, which makes them private (0600, 0700), the mode
    the umask gives anything else the user creates, so a run folder on a shared disk reads as theirs do."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)
    return path


@contextlib.contextmanager
def staged_text(path: Path) -> Iterator[TextIO]:
    """A UTF-8 text file written beside `path` under a hidden name and renamed into place when the block ends: a
    reader sees the whole file or none; an exception leaves `path` as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, staging = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            yield file
        os.replace(as_umask_allows(Path(staging)), path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise

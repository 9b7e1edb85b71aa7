"""Users' text files (configs, data): UTF-8, a BOM allowed, or one error naming the line of the first bad byte;
tables read by the csv module with no limit on a field's length."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tpuplex.errors import TpuplexError


def read_utf8(path: Path) -> str:
    """The file's text; a TpuplexError names the line of the first byte that is not UTF-8."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise TpuplexError(f"{path} is not UTF-8 text (byte 0x{raw[error.start]:02x} on line {line}): save it as "
                           "UTF-8, e.g. iconv -f latin1 -t utf-8") from None


CSV_FIELD_LIMIT = 2**31 - 1
"""A field as long as a C long allows (the csv module's default is 131,072 characters): a long document is a text,
not an error. A quote never closed still shows, as a row with too few fields."""


def csv_reader(lines: Iterable[str], **options: Any) -> Any:
    """`csv.reader(lines, **options)` with fields up to CSV_FIELD_LIMIT characters."""
    csv.field_size_limit(CSV_FIELD_LIMIT)
    return csv.reader(lines, **options)

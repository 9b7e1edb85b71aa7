"""Users' text files (configs, data): UTF-8, a BOM allowed, or one error naming the line of the first bad byte."""

from __future__ import annotations

from pathlib import Path

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

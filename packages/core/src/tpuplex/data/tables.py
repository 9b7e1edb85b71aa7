"""Your own data files, read as named columns: .tsv, .csv, .jsonl, .parquet, and `datasets` save_to_disk folders.

A file is named in the config as a path (relative paths start from the current directory), and the format comes
from its extension:

    .tsv       tab-separated, first row the header, no quoting (GLUE's convention: text may hold lone `"`)
    .csv       comma-separated, first row the header, `"` quoting as Python's csv module and spreadsheets write it
    .jsonl     one JSON object per line, keys are the columns
    .parquet   read with pyarrow (pip install pyarrow)
    folder     written by `datasets`' save_to_disk (pip install datasets); a DatasetDict folder names its split
               after a colon: `path/to/folder:train`

Text files are UTF-8, with or without a byte-order mark; blank lines are skipped. Messages name a row of a text
file by its line and a row of a columnar file by its position counted from 0.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import importlib
import io
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from tpuplex.errors import DataError, absence
from tpuplex.text_files import csv_reader, read_utf8

TEXT_FORMATS = {".tsv": "\t", ".csv": ","}
FORMATS = (*TEXT_FORMATS, ".jsonl", ".parquet")
DATASETS_FOLDER = "datasets folder"
DATASET_DICT_FILE = "dataset_dict.json"  # what save_to_disk writes at the top of a DatasetDict folder
NAME_THE_COLUMNS = ("write the file's names in the config (task.text_columns / task.label_column, or the "
                    "task's templates: {{ column }})")


@dataclasses.dataclass(frozen=True)
class DataFile:
    """One file of your own data.

    field: the config field naming it ("data.train_file"), for messages; spec: the path as written there;
    path: what is read (for a DatasetDict, the split's own folder); kind: a suffix of FORMATS or DATASETS_FOLDER;
    name: the split name it gives (file stem, DatasetDict split, or folder name).
    """

    field: str
    spec: str
    path: Path
    kind: str
    name: str

    def fingerprint(self) -> str:
        """SHA-256 of the file's bytes, or of every file (and its relative path) in a datasets folder."""
        if not self.path.is_dir():
            return _file_sha256(self.path)
        digest = hashlib.sha256()
        for file in sorted(p for p in self.path.rglob("*") if p.is_file()):
            digest.update(f"{file.relative_to(self.path).as_posix()}\0{_file_sha256(file)}\0".encode())
        return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError as error:
        raise DataError(f"cannot read {path} ({error.strerror}): check that it is a file you may read") from None


@dataclasses.dataclass(frozen=True)
class Table:
    """Columns read from a DataFile: column -> N values (strings from .tsv/.csv, JSON or arrow values otherwise).

    lines: the line of each row in a text file; None numbers rows from 0 (parquet, datasets folders).
    """

    source: Path
    columns: dict[str, list[Any]]
    lines: list[int] | None

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()), []))

    def where(self, row: int) -> str:
        """Row `row` (0-based) as the user finds it: "<file> line 7" or "<file> row 6 (counting from 0)"."""
        if self.lines is not None:
            return f"{self.source} line {self.lines[row]}"
        return f"{self.source} row {row} (counting from 0)"


def text_file(field: str, spec: str) -> DataFile:
    """`spec` as the DataFile of a language-modelling task's raw text: a `.txt` file (which the task reads as it
    defines), or a table (`resolve_file`) whose text column it reads."""
    path = Path(spec).expanduser()
    if path.suffix == ".txt":
        if not path.is_file():
            raise DataError(f"{field} = {spec!r} {absence(path)}: give the path of a UTF-8 text file")
        return DataFile(field, spec, path, ".txt", path.stem)
    return resolve_file(field, spec)


def resolve_file(field: str, spec: str) -> DataFile:
    """The DataFile that `spec` (from the config field `field`) names; raises a TpuplexError when it does not exist
    or has no supported format."""
    if not spec:
        raise DataError(f"{field} has an empty path: give a file such as data/dev.csv")
    path = Path(spec).expanduser()
    folder, colon, split = spec.rpartition(":")
    if not path.exists() and colon and Path(folder).expanduser().is_dir():
        return _dataset_dict_split(field, spec, Path(folder).expanduser(), split)
    if not path.exists():
        raise DataError(f"{field} = {spec!r} does not exist: give the path of the file (relative paths start "
                        "from the current directory)")
    if path.is_dir():
        if (path / DATASET_DICT_FILE).is_file():
            raise DataError(f"{field} = {spec!r} is a DatasetDict folder: name its split, e.g. "
                            f"{spec}:{_dict_splits(path)[0]} (its splits: {', '.join(_dict_splits(path))})")
        return DataFile(field, spec, path, DATASETS_FOLDER, path.name)
    kind = path.suffix.lower()
    if kind not in FORMATS:
        raise DataError(f"{field} = {spec!r} has the unknown file type {path.suffix or '(none)'!r}: use "
                        f"{', '.join(FORMATS)}, or a folder written by datasets' save_to_disk")
    return DataFile(field, spec, path, kind, path.stem)


def _dataset_dict_split(field: str, spec: str, folder: Path, split: str) -> DataFile:
    """`folder:split`, which must name a split of the DatasetDict saved in `folder`."""
    if not (folder / DATASET_DICT_FILE).is_file():
        raise DataError(f"{field} = {spec!r}: {folder} is not a DatasetDict folder (no {DATASET_DICT_FILE}): "
                        "drop the ':split' for a single Dataset folder")
    if split not in _dict_splits(folder):
        raise DataError(f"{field} = {spec!r}: the DatasetDict in {folder} has no split {split!r}: use one of "
                        f"{', '.join(_dict_splits(folder))}")
    return DataFile(field, spec, folder / split, DATASETS_FOLDER, split)


def _dict_splits(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_dir())


def read_table(file: DataFile, columns: Sequence[str], optional: Sequence[str] = ()) -> Table:
    """The named columns of `file`, and those of `optional` the file has (a test file's labels).

    Raises a TpuplexError naming the file (and line or row) and the fix for a missing column, a damaged row,
    a file that is not UTF-8 or not valid in its format, a missing optional library, or a file with no rows.
    """
    if file.kind in TEXT_FORMATS:
        table = _read_delimited(file.path, TEXT_FORMATS[file.kind], columns, optional)
    elif file.kind == ".jsonl":
        table = _read_jsonl(file.path, columns, optional)
    else:
        table = _read_arrow(file, columns, optional)
    if not len(table):
        raise DataError(f"{file.path} holds no examples: {file.field} needs a file with at least one example")
    return table


def _read_delimited(path: Path, delimiter: str, columns: Sequence[str], optional: Sequence[str]) -> Table:
    """A .tsv (no quoting) or .csv (double-quote quoting) file with a header row."""
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    rows = csv_reader(io.StringIO(read_utf8(path), newline=""), delimiter=delimiter, quoting=quoting)
    records = _records(rows, path)
    header, _ = next(records, ([], 0))
    if not header:  # an empty file: read_table says so
        return Table(path, {name: [] for name in columns}, [])
    wanted = [*columns, *(name for name in optional if name in header)]
    indices = [_header_index(header, name, path) for name in wanted]
    values: list[list[str]] = [[] for _ in wanted]
    lines = []
    for row, line in records:
        if len(row) != len(header):
            separated = "tab-separated" if delimiter == "\t" else "comma-separated"
            fix = "repair the row" if delimiter == "\t" else "quote texts that hold commas, and close every quote"
            raise DataError(f"{path} line {line} has {len(row)} {separated} fields, the header has "
                            f"{len(header)}: {fix}")
        for column, index in zip(values, indices, strict=True):
            column.append(row[index])
        lines.append(line)
    return Table(path, dict(zip(wanted, values, strict=True)), lines)


def _records(rows: Any, path: Path) -> Iterator[tuple[list[str], int]]:
    """(fields, first line) of every non-blank row of the csv reader `rows`; a csv error becomes a TpuplexError."""
    line = 1
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except csv.Error as error:
            raise _csv_error(path, line, error) from None
        if row:
            yield row, line
        line = rows.line_num + 1


def _csv_error(path: Path, line: int, error: csv.Error) -> DataError:
    if "field larger than field limit" in str(error):
        return DataError(f"{path} line {line}: a field is longer than the csv module's limit of "
                         f"{csv.field_size_limit()} characters, usually a quote that is never closed: close the "
                         "quote, or give very long texts as .jsonl or .parquet")
    return DataError(f"{path} line {line} is not valid CSV ({error}): repair the row")


def _header_index(header: Sequence[str], name: str, path: Path) -> int:
    if name not in header:
        raise DataError(f"{path} has no column {name!r} (its header is {', '.join(header)}): rename the column "
                        f"or {NAME_THE_COLUMNS}")
    if header.count(name) > 1:
        raise DataError(f"{path} has the column {name!r} twice in its header: give each column its own name")
    return list(header).index(name)


def _read_jsonl(path: Path, columns: Sequence[str], optional: Sequence[str]) -> Table:
    """One JSON object per line; the optional columns are those the first object has."""
    wanted: list[str] | None = None
    values: dict[str, list[Any]] = {}
    lines = []
    for line, text in enumerate(read_utf8(path).split("\n"), start=1):
        if not text.strip():
            continue
        record = _json_object(path, line, text)
        if wanted is None:
            wanted = [*columns, *(name for name in optional if name in record)]
            values = {name: [] for name in wanted}
        for name in wanted:
            if name not in record:
                raise DataError(f"{path} line {line} has no field {name!r} (it has {', '.join(record) or 'none'}): "
                                f"add it, or {NAME_THE_COLUMNS}")
            values[name].append(record[name])
        lines.append(line)
    return Table(path, values, lines)


def _json_object(path: Path, line: int, text: str) -> dict[str, Any]:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"{path} line {line} is not valid JSON ({error.msg}, column {error.colno}): write one "
                        "JSON object per line") from None
    if not isinstance(record, dict):
        raise DataError(f"{path} line {line} holds a JSON {type(record).__name__}, not an object: write one "
                        'JSON object per line, e.g. {"text": "...", "label": 1}')
    return record


def _read_arrow(file: DataFile, columns: Sequence[str], optional: Sequence[str]) -> Table:
    """A parquet file or a datasets folder, through an arrow table of the wanted columns."""
    table = _parquet_table(file.path) if file.kind == ".parquet" else _dataset_table(file.path)
    names = table.column_names
    for name in columns:
        if name not in names:
            raise DataError(f"{file.path} has no column {name!r} (its columns are {', '.join(names)}): rename "
                            f"the column or {NAME_THE_COLUMNS}")
    wanted = [*columns, *(name for name in optional if name in names)]
    return Table(file.path, {name: table.column(name).to_pylist() for name in wanted}, None)


def _parquet_table(path: Path) -> Any:
    pyarrow = _optional_import("pyarrow", path)
    parquet = importlib.import_module("pyarrow.parquet")
    try:
        return parquet.read_table(path)
    except (pyarrow.ArrowException, OSError) as error:
        raise DataError(f"{path} is not a readable parquet file ({error}): write it with pandas' "
                        "DataFrame.to_parquet or pyarrow.parquet.write_table") from None


def _dataset_table(path: Path) -> Any:
    datasets = _optional_import("datasets", path)
    try:
        dataset = datasets.load_from_disk(str(path))
    except Exception as error:  # noqa: BLE001 - datasets raises many types for a folder it cannot read
        raise DataError(f"{path} is not a folder written by datasets' save_to_disk ({type(error).__name__}: "
                        f"{error}): save it with dataset.save_to_disk(folder)") from None
    # The arrow format reads the stored table (no torch or numpy formatting a saved dataset may have set).
    return dataset.with_format("arrow")[:]


def _optional_import(module: str, path: Path) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DataError(f"reading {path} needs the {module} library: pip install {module} "
                        "(or pip install 'tpuplex-core[data]')") from None

"""A small copy of ../shared for the fast tier: the same files and layout, each cut to its first rows or images, so
a documented command runs end to end (prepare, train, a whole evaluation) in seconds on real data."""

from __future__ import annotations

from pathlib import Path

IMAGES_PER_CLASS = 24
"""Per class folder: CIFAR-10's 10 classes give 240 training and 240 test images, the flowers' 5 give 120."""
TABLE_ROWS = 100
"""Of each table (a GLUE .tsv or an audio manifest, with its header). Evaluations dominate the fast tier's runs of
real examples: MiniLM takes about 5 s of the 2-core machine for MRPC's first 300 dev pairs."""
CONLL_LINES = 300
"""Of each CoNLL file (cut at the next sentence end)."""
PLAIN_TEXT_LINES = 4000
"""Of a plain-text corpus (a tenth of tiny Shakespeare): its held-out part must still fill rows of 128 tokens."""
SMALL_BATCH = 8
"""Rows a step of an example run at the subset scale, not its own 12-128: what such a run checks is that the
documented command runs end to end, whatever its batch (MiniLM's step on 32 rows of 128 tokens takes about 2 s of the
2-core machine)."""


def subset_path(shared: Path, real: Path, root: Path) -> Path:
    """The subset of `real` (a file or folder inside `shared`) under `root`, written on first use."""
    copy = root / real.resolve().relative_to(shared.resolve())
    if not copy.exists():
        _write_subset(real, copy)
    return copy


def _write_subset(real: Path, copy: Path) -> None:
    if real.is_file():
        copy.parent.mkdir(parents=True, exist_ok=True)
        lines = {".txt": PLAIN_TEXT_LINES, ".tsv": TABLE_ROWS + 1}.get(real.suffix, CONLL_LINES)
        text = _first_lines(real.read_text(encoding="utf-8-sig"), lines, sentences=real.suffix != ".tsv")
        copy.write_text(_absolute_paths(text, real.parent) if text.startswith("path\t") else text, encoding="utf-8")
        return
    for child in sorted(real.iterdir()):
        if child.is_dir() and not any(grandchild.is_dir() for grandchild in child.iterdir()):
            (copy / child.name).mkdir(parents=True)  # a class folder of images: link its first few
            for image in sorted(child.iterdir())[:IMAGES_PER_CLASS]:
                (copy / child.name / image.name).symlink_to(image)
        elif child.is_dir():
            _write_subset(child, copy / child.name)
        elif child.suffix in (".tsv", ".conll", ".txt", ".annotated"):
            _write_subset(child, copy / child.name)


def _absolute_paths(text: str, folder: Path) -> str:
    """A manifest of files (a `path` column first, relative to its own folder) with its paths made absolute: the
    cut copy lives elsewhere, the recordings stay where they are."""
    header, *rows = text.splitlines(keepends=True)
    return header + "".join(f"{(folder / row.split(chr(9), 1)[0]).resolve()}\t{row.split(chr(9), 1)[1]}"
                            for row in rows)


def _first_lines(text: str, count: int, sentences: bool) -> str:
    """The first `count` lines; with `sentences` (CoNLL, plain text), up to the next blank line after them."""
    lines = text.splitlines(keepends=True)
    end = min(count, len(lines))
    while sentences and end < len(lines) and lines[end - 1].strip():
        end += 1
    return "".join(lines[:end])

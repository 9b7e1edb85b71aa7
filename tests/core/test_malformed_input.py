"""Random malformed input never reaches the user as a bug: the config validator and the CoNLL, CSV, TSV and JSONL
readers either accept it or refuse it with a TpuplexError (the CLI's one line and exit 2), never another exception
(exit 1).

Property-based (hypothesis): configs of known and unknown sections and fields with values of every TOML type, and
files of random lines built from the characters these formats give meaning to (tabs, commas, quotes, braces,
blank lines), some not UTF-8.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuplex import config as config_lib
from tpuplex import tasks
from tpuplex.config import Config
from tpuplex.data.tables import read_table, resolve_file
from tpuplex.errors import TpuplexError
from tpuplex.tasks.token_classification import data as tagged

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SECTIONS = {name: list(getattr(Config(), name).__dataclass_fields__) for name in ("model", "data", "train", "runtime")}
SECTIONS["task"] = ["name", "mask_probability", "validation_fraction", "tag_column", "image_size", "crop_padding",
                    "classes", "tags", "label_all_tokens", "flip", "text_column"]

SCALARS = st.one_of(st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.text(max_size=12), st.sampled_from(["", "0", "minilm", "mrpc", "auto", "tpu", "{dataset}",
                                                           "sequence_classification", "masked_lm", "a:B", "x.y:Z"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                            max_size=3), max_leaves=8)


@st.composite
def raw_configs(draw) -> dict:
    raw = {}
    for section in draw(st.lists(st.sampled_from([*SECTIONS, "extra"]), max_size=4, unique=True)):
        names = SECTIONS.get(section, ["field"])
        fields = draw(st.dictionaries(st.sampled_from([*names, "unknown_field"]), VALUES, max_size=4))
        raw[section] = draw(st.one_of(st.just(fields), VALUES)) if section == "extra" else fields
    return raw


@EXAMPLES
@given(raw_configs())
def test_any_config_is_accepted_or_refused_in_one_clear_error(raw: dict) -> None:
    try:
        loaded = config_lib.from_dict(raw)
        task = tasks.get(loaded.task.name)
        tasks.options(task, loaded.task.options)
    except TpuplexError as error:
        assert str(error).strip()  # the CLI prints it as one line (`tpuplex: error: ...`) and exits 2


LINE_PIECES = st.sampled_from(["EU", "B-ORG", "I-PER", "O", "word", "\t", " ", ",", '"', "{", "}", "[", "]", ":",
                               "-DOCSTART-", "1", "0", "label", "text", "tokens", "tags", "é", "\u2028", "\x00"])
LINES = st.lists(st.lists(LINE_PIECES, max_size=6).map("".join), max_size=12)
WORDS = st.sampled_from(["EU", "rejects", "German", "call", "Peter", "é", "-DOCSTART-", "", "a b"])
TAGS = st.sampled_from(["O", "B-ORG", "I-ORG", "B-PER", "I-PER", "I-MISC", "ORG", ""])
CONLL_LINES = st.lists(st.one_of(
    st.tuples(WORDS, st.sampled_from(["\t", " ", "\t\t", "  "]), TAGS).map("".join),  # a word and its tag
    st.tuples(WORDS, st.just("\tNN\t"), TAGS).map("".join),                           # three columns
    st.just(""), LINES.map(lambda lines: lines[0] if lines else "")), max_size=16)
JSONL_LINES = st.lists(st.one_of(
    st.tuples(st.lists(WORDS, max_size=4), st.lists(TAGS, max_size=4)).map(
        lambda pair: json.dumps({"tokens": pair[0], "tags": pair[1]})),
    st.dictionaries(st.sampled_from(["tokens", "tags", "x"]), st.one_of(st.lists(WORDS, max_size=3), WORDS,
                                                                       st.integers())).map(json.dumps),
    st.just(""), st.just("{")), max_size=8)


def written(suffix: str, lines: list[str], latin1: bool) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="malformed-"))
    path = folder / f"data{suffix}"
    text = "\n".join(lines)
    path.write_bytes(text.encode("latin-1", errors="replace") if latin1 else text.encode("utf-8"))
    return path


@EXAMPLES
@given(st.one_of(st.tuples(st.just(".conll"), CONLL_LINES), st.tuples(st.just(".jsonl"), JSONL_LINES),
                 st.tuples(st.sampled_from([".conll", ".jsonl", ".csv"]), LINES)), st.booleans(), st.integers(-3, 3))
def test_any_tagging_file_is_read_or_refused_in_one_clear_error(file, latin1, tag_column) -> None:
    suffix, lines = file
    path = written(suffix, lines, latin1)
    try:
        file = tagged.data_file("data.train_file", str(path))
        found = tagged.read_sentences(file, tag_column, "tokens", "tags", require_tags=True)
        assert len(found.words) == len(found.tags) > 0
        assert all(len(words) == len(tags) > 0 for words, tags in zip(found.words, found.tags, strict=True))
    except TpuplexError as error:
        assert str(error).strip()  # the CLI prints it as one line (`tpuplex: error: ...`) and exits 2


@EXAMPLES
@given(st.sampled_from([".csv", ".tsv", ".jsonl"]), LINES, st.booleans())
def test_any_table_is_read_or_refused_in_one_clear_error(suffix, lines, latin1) -> None:
    if suffix == ".jsonl" and lines:
        lines = [*lines[:-1], json.dumps({"text": lines[-1], "label": 1})]
    path = written(suffix, lines, latin1)
    try:
        table = read_table(resolve_file("data.train_file", str(path)), ["text", "label"])
        assert len(table.columns["text"]) == len(table.columns["label"]) == len(table) > 0
    except TpuplexError as error:
        assert str(error).strip()  # the CLI prints it as one line (`tpuplex: error: ...`) and exits 2

"""Tokenization into static-shape arrays (real MiniLM tokenizer), the vocab.txt fallback, and the on-disk cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from tpuplex import TpuplexError
from tpuplex.data.shards import ShardWriter
from tpuplex.data.tokenize import load_tokenizer
from tpuplex.tasks.sequence_classification import features
from tpuplex.tasks.sequence_classification.features import encode, load_encoded
from tpuplex.tasks.sequence_classification.glue import Examples, get_dataset, read_split

PAIRS = [
    ("The cat sat on the mat.", "A cat was sitting on a mat."),
    ("Stocks fell sharply on Monday, analysts said.", "Shares dropped."),
    ("He said the foodservice pie business doesn 't fit .", '" The pie business does not fit our strategy .'),
]


def pair_examples(pairs=PAIRS) -> Examples:
    return Examples([a for a, _ in pairs], [b for _, b in pairs], np.arange(len(pairs), dtype=np.int32) % 2)


@pytest.fixture(scope="module")
def minilm_tokenizer(minilm_dir) -> Tokenizer:
    return load_tokenizer(minilm_dir, 32)


# --- tokenization on the real MiniLM tokenizer ------------------------------------------------------------------


def test_pair_layout_and_type_ids(minilm_dir, minilm_tokenizer):
    cls, sep = minilm_tokenizer.token_to_id("[CLS]"), minilm_tokenizer.token_to_id("[SEP]")
    encoded = encode(pair_examples(), minilm_tokenizer, 32)
    assert encoded.input_ids.shape == encoded.token_type_ids.shape == (3, 32)
    assert encoded.input_ids.dtype == encoded.token_type_ids.dtype == encoded.lengths.dtype == np.int32
    for ids, types, length in zip(encoded.input_ids, encoded.token_type_ids, encoded.lengths, strict=True):
        separators = np.flatnonzero(ids == sep)
        assert ids[0] == cls and len(separators) == 2 and separators[1] == length - 1
        assert np.all(types[: separators[0] + 1] == 0) and np.all(types[separators[0] + 1 : length] == 1)
        assert np.all(ids[length:] == 0) and np.all(types[length:] == 0)
        assert np.all(ids[:length] != 0)
    np.testing.assert_array_equal(encoded.labels, pair_examples().labels)


def test_single_sentence_layout(minilm_tokenizer):
    cls, sep = minilm_tokenizer.token_to_id("[CLS]"), minilm_tokenizer.token_to_id("[SEP]")
    encoded = encode(Examples(["it 's a charming journey . "], None, np.array([1], np.int32)), minilm_tokenizer, 32)
    length = encoded.lengths[0]
    tokens = [minilm_tokenizer.id_to_token(i) for i in encoded.input_ids[0, :length]]
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "charming" in tokens
    assert encoded.input_ids[0, 0] == cls and encoded.input_ids[0, length - 1] == sep
    assert not encoded.token_type_ids.any()


def test_matches_the_tokenizers_library_encode(minilm_dir, minilm_tokenizer):
    reference = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    reference.no_padding()
    reference.enable_truncation(32)
    encoded = encode(pair_examples(), minilm_tokenizer, 32)
    for row, (a, b) in enumerate(PAIRS):
        expected = reference.encode(a, b)
        length = len(expected.ids)
        assert encoded.lengths[row] == length
        assert encoded.input_ids[row, :length].tolist() == expected.ids
        assert encoded.token_type_ids[row, :length].tolist() == expected.type_ids


def test_truncation_to_max_length_is_longest_first(minilm_dir):
    long_a, short_b = " ".join(["word"] * 50), "a short one"
    tokenizer = load_tokenizer(minilm_dir, 16)
    encoded = encode(Examples([long_a], [short_b], np.zeros(1, np.int32)), tokenizer, 16)
    assert encoded.input_ids.shape == (1, 16) and encoded.lengths[0] == 16
    types = encoded.token_type_ids[0]
    # longest_first trims the long first text and keeps the short second one whole: [CLS] 10 x word [SEP] 3 [SEP]
    assert int(np.sum(types == 1)) == 4
    assert tokenizer.decode(encoded.input_ids[0, 12:15].tolist()) == short_b


def test_the_files_own_padding_is_switched_off(minilm_dir):
    # MiniLM's tokenizer.json pads to a fixed 128; the arrays must follow max_length and the real lengths only.
    assert json.loads((minilm_dir / "tokenizer.json").read_text())["padding"] is not None
    encoded = encode(pair_examples(), load_tokenizer(minilm_dir, 64), 64)
    assert encoded.input_ids.shape == (3, 64) and encoded.lengths.max() < 64


def test_max_length_too_short_for_the_special_tokens(minilm_dir):
    with pytest.raises(TpuplexError, match="max_length = 2"):
        encode(pair_examples(), load_tokenizer(minilm_dir, 2), 2)
    with pytest.raises(TpuplexError, match="data.max_length = 0 must be positive"):
        load_tokenizer(minilm_dir, 0)


def test_a_tokenizer_that_does_not_truncate_is_refused(minilm_dir):
    untruncated = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    untruncated.no_padding()
    with pytest.raises(TpuplexError, match="returned .* tokens for max_length = 4: load it with load_tokenizer"):
        encode(pair_examples(), untruncated, 4)


# --- finding the tokenizer --------------------------------------------------------------------------------------


def write_vocab(folder: Path, do_lower_case: bool | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "Hello", "world"]
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n")
    if do_lower_case is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": do_lower_case}))
    return folder


@pytest.mark.parametrize(("do_lower_case", "expected"), [(True, [2, 5, 7, 3]), (None, [2, 5, 7, 3]),
                                                         (False, [2, 6, 7, 3])])
def test_vocab_txt_fallback_lowercases_as_the_config_says(tmp_path, do_lower_case, expected):
    tokenizer = load_tokenizer(write_vocab(tmp_path, do_lower_case), 8)
    encoded = encode(Examples(["Hello world"], None, np.zeros(1, np.int32)), tokenizer, 8)
    assert encoded.input_ids[0].tolist() == expected + [0] * 4


def test_vocab_txt_fallback_equals_tokenizer_json_on_minilm(minilm_dir, minilm_tokenizer, tmp_path):
    for name in ("vocab.txt", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((minilm_dir / name).read_bytes())
    examples = pair_examples([*PAIRS, ("Café naïve DÉJÀ vu!", "Ünïcode text, 1,234.5 euros.")])
    assert_same_arrays(encode(examples, load_tokenizer(tmp_path, 32), 32), encode(examples, minilm_tokenizer, 32))


def test_no_tokenizer_files(tmp_path):
    with pytest.raises(TpuplexError, match=f"no tokenizer in {tmp_path}: .*tokenizer.json or vocab.txt"):
        load_tokenizer(tmp_path, 16)


def test_bad_do_lower_case(tmp_path):
    write_vocab(tmp_path, None)
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": "yes"}')
    with pytest.raises(TpuplexError, match="do_lower_case = 'yes' must be true or false"):
        load_tokenizer(tmp_path, 16)


# --- load_encoded and its cache (tiny tokenizer and tiny MRPC from conftest) ------------------------------------


def forbid_tokenizing(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("tokenized although the cache should have been used")

    monkeypatch.setattr(features, "encode", fail)


def assert_same_arrays(left, right):
    left, right = (split.load() if hasattr(split, "load") else split for split in (left, right))
    for name in ("input_ids", "token_type_ids", "lengths", "labels"):
        assert getattr(left, name).dtype == getattr(right, name).dtype
        np.testing.assert_array_equal(getattr(left, name), getattr(right, name))


def test_load_encoded_equals_reading_and_encoding(tiny_model, tiny_mrpc, tmp_path):
    task = get_dataset("mrpc")
    encoded = load_encoded(task, "dev", tiny_mrpc, tiny_model, 24, tmp_path / "cache")
    expected = encode(read_split(task, "dev", tiny_mrpc), load_tokenizer(tiny_model, 24), 24)
    assert_same_arrays(encoded, expected)


def test_second_call_reads_the_cache_without_tokenizing(tiny_model, tiny_mrpc, tmp_path, monkeypatch):
    task, cache = get_dataset("mrpc"), tmp_path / "cache"
    first = load_encoded(task, "train", str(tiny_mrpc), tiny_model, 24, cache)
    [cache_file] = cache.iterdir()
    assert cache_file.name.startswith("mrpc-train-L24-") and (cache_file / "manifest.json").is_file()
    forbid_tokenizing(monkeypatch)
    assert_same_arrays(load_encoded(task, "train", str(tiny_mrpc), tiny_model, 24, cache), first)


def test_cache_key_follows_max_length_split_and_data(tiny_model, tiny_mrpc, tmp_path):
    task, cache = get_dataset("mrpc"), tmp_path / "cache"
    load_encoded(task, "dev", tiny_mrpc, tiny_model, 24, cache)
    load_encoded(task, "dev", tiny_mrpc, tiny_model, 32, cache)
    load_encoded(task, "train", tiny_mrpc, tiny_model, 24, cache)
    assert len(list(cache.iterdir())) == 3
    edited = tmp_path / "MRPC"
    edited.mkdir()
    lines = (tiny_mrpc / "dev.tsv").read_text(encoding="utf-8").splitlines()
    (edited / "dev.tsv").write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    shorter = load_encoded(task, "dev", edited, tiny_model, 24, cache)
    assert len(shorter) == len(lines) - 2 and len(list(cache.iterdir())) == 4


def test_cache_key_follows_the_tokenizer(tiny_model, tiny_mrpc, tmp_path):
    task, cache = get_dataset("mrpc"), tmp_path / "cache"
    vocab_only = tmp_path / "vocab-only"
    vocab_only.mkdir()
    (vocab_only / "vocab.txt").write_bytes((tiny_model / "vocab.txt").read_bytes())
    load_encoded(task, "dev", tiny_mrpc, tiny_model, 24, cache)
    load_encoded(task, "dev", tiny_mrpc, vocab_only, 24, cache)
    assert len(list(cache.iterdir())) == 2


def test_bad_input_leaves_no_cache(tiny_model, tmp_path):
    folder = tmp_path / "RTE"
    folder.mkdir()
    (folder / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    cache = tmp_path / "cache"
    with pytest.raises(TpuplexError, match="label 'maybe'"):
        load_encoded(get_dataset("rte"), "train", folder, tiny_model, 16, cache)
    assert not cache.exists() or not any(cache.iterdir())


def test_interrupted_write_leaves_no_partial_file(tiny_model, tiny_mrpc, tmp_path, monkeypatch):
    def write_part_then_interrupt(writer):
        (writer.staging / "records-00000.bin").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(ShardWriter, "_finish_shard", write_part_then_interrupt)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        load_encoded(get_dataset("mrpc"), "dev", tiny_mrpc, tiny_model, 24, cache)
    assert list(cache.iterdir()) == []


def test_unreadable_cache_file_is_rebuilt(tiny_model, tiny_mrpc, tmp_path):
    task, cache = get_dataset("mrpc"), tmp_path / "cache"
    first = load_encoded(task, "dev", tiny_mrpc, tiny_model, 24, cache)
    [cache_file] = cache.iterdir()
    (cache_file / "manifest.json").write_bytes(b"not a manifest")
    assert_same_arrays(load_encoded(task, "dev", tiny_mrpc, tiny_model, 24, cache), first)
    assert features.read_cache(cache_file) is not None


def test_cache_dir_that_cannot_be_created(tiny_model, tiny_mrpc, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(TpuplexError, match="cannot write the token cache in .*set data.cache_dir"):
        load_encoded(get_dataset("mrpc"), "dev", tiny_mrpc, tiny_model, 24, blocker / "cache")


def test_real_sst2_dev_with_minilm(shared_glue, minilm_dir, tmp_path):
    encoded = load_encoded(get_dataset("sst2"), "dev", shared_glue / "SST-2", minilm_dir, 64, tmp_path).load()
    assert encoded.input_ids.shape == (872, 64) and len(encoded.labels) == 872
    assert encoded.lengths.min() >= 3 and encoded.lengths.max() <= 64
    assert not encoded.token_type_ids.any()

"""The causal_lm task's data and the generate command's windows, framework-free."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from tpuplex import kinds, models
from tpuplex.commands.generate import bucket, left_padded
from tpuplex.config import from_dict
from tpuplex.data.corpus import pack_stream
from tpuplex.engine.schedule import warmup_cosine_decay
from tpuplex.errors import TpuplexError
from tpuplex.models.decoder import initial_params
from tpuplex.protocol import decays
from tpuplex.tasks.base import TaskData
from tpuplex.tasks.causal_lm import TASK, Options
from tpuplex.tasks.causal_lm.data import (
    Characters,
    NextTokenRows,
    WindowSlots,
    next_token_rows,
    random_windows,
    stream,
)


def test_packed_rows_predict_every_token_but_the_first_once():
    ids = np.arange(1, 204, dtype=np.int32)
    view = NextTokenRows(pack_stream(ids, 16))
    assert len(view) == 13 and view.max_length == 17 and view.token_count == 203
    batch = view.rows(np.arange(len(view)), 17)
    rows = next_token_rows({**batch, "weight": np.ones(len(view), np.float32)})
    predicted = rows["labels"][rows["weight"] > 0]
    np.testing.assert_array_equal(predicted, ids[1:])
    np.testing.assert_array_equal(rows["input_ids"][rows["weight"] > 0], ids[:-1])


def test_a_token_range_is_its_own_stream():
    """A held-out split: tokens [first, stop) of the packed source, cut inside a row, no token read past stop."""
    ids = np.arange(1, 204, dtype=np.int32)
    source = NextTokenRows(pack_stream(ids, 16)).source
    head, tail = NextTokenRows(source, 0, 182), NextTokenRows(source, 182)
    for view, tokens in ((head, ids[:182]), (tail, ids[182:])):
        rows = next_token_rows({**view.rows(np.arange(len(view)), 17), "weight": np.ones(len(view), np.float32)})
        np.testing.assert_array_equal(rows["labels"][rows["weight"] > 0], tokens[1:])
        np.testing.assert_array_equal(rows["input_ids"][rows["weight"] > 0], tokens[:-1])
    starts = np.array([0, 5, 15, 16, 165])
    np.testing.assert_array_equal(head.windows(starts, 17), ids[starts[:, None] + np.arange(17)])
    np.testing.assert_array_equal(tail.windows(np.array([0, 4]), 17), ids[182 + np.array([0, 4])[:, None]
                                                                          + np.arange(17)])


def test_the_character_vocabulary_is_nanogpts_sorted_set():
    vocabulary = Characters.of(["hello\nworld", "!"])
    assert vocabulary.characters == "\n!dehlorw"
    np.testing.assert_array_equal(vocabulary.encode("low\n", "text"), [5, 6, 8, 0])
    assert vocabulary.decode(vocabulary.encode("hello\nworld!", "text")) == "hello\nworld!"
    with pytest.raises(TpuplexError, match="the character 'z'"):
        vocabulary.encode("hez", "the prompt")


def test_random_windows_are_nanogpts_batches_from_seed_and_step():
    ids = np.arange(100, dtype=np.int32)
    stream = NextTokenRows(pack_stream(ids, 8))
    first = random_windows(stream, 4, 9, np.random.default_rng([7, 3]))
    again = random_windows(stream, 4, 9, np.random.default_rng([7, 3]))
    assert all(np.array_equal(first[key], again[key]) for key in first)
    starts = np.random.default_rng([7, 3]).integers(0, 100 - 9 + 1, 4)  # nanoGPT's draw: ix = randint(len - L - 1)
    np.testing.assert_array_equal(first["input_ids"], ids[starts[:, None] + np.arange(8)])
    np.testing.assert_array_equal(first["labels"], first["input_ids"] + 1)
    assert first["input_ids"].shape == (4, 8) and first["weight"].all()


def test_the_last_tenth_is_held_out_and_the_vocabulary_pinned(tmp_path):
    text = "".join(chr(ord("a") + i % 26) for i in range(1000))
    (tmp_path / "input.txt").write_text(text)
    config = from_dict({"task": {"name": "causal_lm", "tokenizer": "characters"},
                        "data": {"train_file": str(tmp_path / "input.txt"), "max_length": 10,
                                 "cache_dir": str(tmp_path / "cache")}})
    options = Options(tokenizer="characters")
    TASK.check(config, options)
    data = TASK.prepare(config, options, tmp_path)
    assert data.pinned_options() == {"characters": "abcdefghijklmnopqrstuvwxyz"}
    held_out = data.eval["validation"]
    assert held_out.token_count == 100 and data.train.token_count == 900

def test_a_run_without_its_pinned_characters_is_refused_not_rebuilt_from_the_text(tmp_path):
    (tmp_path / "input.txt").write_text("hello world\n" * 50)
    config = from_dict({"task": {"name": "causal_lm", "tokenizer": "characters"},
                        "data": {"train_file": str(tmp_path / "input.txt"), "max_length": 8}})
    with pytest.raises(TpuplexError, match="holds no character vocabulary .* restore run.json from the run"):
        TASK.model_data(config, Options(tokenizer="characters"), None)
    assert TASK.model_data(config, Options(tokenizer="characters", characters="\n dehlorw"), None).vocabulary.size == 10


@pytest.mark.parametrize("documents", [1, 3])
def test_a_streamed_text_file_gives_the_bytes_of_a_table_read_in_memory(tmp_path, documents):
    """A .txt (one document) or .jsonl (several: end-of-text after each) file goes through prepare's code into the
    cache; the same documents in a .csv are read in memory. Both splits give the same rows, byte for byte."""
    texts = [f"Doc {n}: " + "".join(chr(ord("a") + (n + i * 7) % 26) for i in range(300)) + "\nend.\n"
             for n in range(documents)]
    streamed = tmp_path / ("corpus.txt" if documents == 1 else "corpus.jsonl")
    streamed.write_text(texts[0] if documents == 1 else "".join(json.dumps({"text": t}) + "\n" for t in texts))
    with (tmp_path / "corpus.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([["text"], *([t] for t in texts)])
    rows = {}
    for file in (streamed, tmp_path / "corpus.csv"):
        config = from_dict({"task": {"name": "causal_lm", "tokenizer": "characters"},
                            "data": {"train_file": str(file), "max_length": 16, "cache_dir": str(tmp_path / "c")}})
        data = TASK.prepare(config, Options(tokenizer="characters"), tmp_path)
        rows[file.suffix] = [split.rows(np.arange(len(split)), 17) for split in (data.train, data.eval["validation"])]
        vocabulary = data.vocabulary
    assert (tmp_path / "c").is_dir() and vocabulary.end_of_text == len(vocabulary.characters)
    (train, held_out), (train_csv, held_out_csv) = rows[streamed.suffix], rows[".csv"]
    for got, want in ((train, train_csv), (held_out, held_out_csv)):
        assert got.keys() == want.keys() and all(np.array_equal(got[key], want[key]) for key in got)

    def tokens(split: dict[str, np.ndarray]) -> np.ndarray:
        predicted = next_token_rows({**split, "weight": np.ones(len(split["input_ids"]), np.float32)})
        return np.concatenate([split["input_ids"][:1, 0], predicted["labels"][predicted["weight"] > 0]])

    # `stream`: the documents' ids, each followed by end-of-text when there are several
    np.testing.assert_array_equal(np.concatenate([tokens(train), tokens(held_out)]),
                                  stream(texts, vocabulary, "the corpus"))


def test_a_prompt_window_is_a_power_of_two_bucket_left_padded():
    assert [bucket(n, 64) for n in (1, 8, 9, 17, 40)] == [8, 8, 16, 32, 32]
    ids, mask = left_padded([np.array([1, 2, 3]), np.arange(1, 11)], 8)
    np.testing.assert_array_equal(ids[0], [0, 0, 0, 0, 0, 1, 2, 3])
    np.testing.assert_array_equal(ids[1], np.arange(3, 11))
    assert mask[0].tolist() == [0] * 5 + [1] * 3 and mask[1].all()


NORMS = ("transformer.h.0.ln_1.weight", "transformer.ln_f.weight", "model.norm.weight",
         "model.layers.1.input_layernorm.weight")
MATRICES = ("transformer.h.0.attn.c_attn.weight", "transformer.wte.weight", "lm_head.weight")


@pytest.mark.parametrize(("name", "decayed"), [(name, False) for name in NORMS] + [(name, True) for name in MATRICES])
def test_weight_decay_skips_the_decoders_norms(name, decayed):
    assert decays(name) is decayed


def test_cosine_decays_to_the_floor_as_nanogpt():
    steps = (100, 1050, 2000, 2500)
    rates = [warmup_cosine_decay(step, peak=1e-3, warmup=100, total=2000, floor=1e-4) for step in steps]
    np.testing.assert_allclose(rates, [1e-3, 5.5e-4, 1e-4, 1e-4])


def test_a_bias_free_gpt2_has_no_bias_and_exports_zero_ones():
    """nanoGPT's bias = False: no Linear or LayerNorm bias to train; the HF export adds them as zeros."""
    config = {"model_type": "gpt2", "vocab_size": 65, "n_positions": 16, "n_embd": 8, "n_layer": 2, "n_head": 2}
    family, biased = models.architecture_of(config)
    _, bias_free = models.architecture_of({**config, "bias": False})
    drawn = initial_params(bias_free, seed=0)
    params = {family.hf_name(name): array for name, array in drawn.items()}
    assert not [name for name in params if name.endswith(".bias")]
    exported = family.hf_weights(bias_free, params)
    assert {name: array.shape for name, array in exported.items()} == family.hf_shapes(biased)
    assert all(not exported[name].any() for name in exported.keys() - params.keys())


def test_documents_of_a_tokenizer_without_end_of_text_are_refused_in_one_line(tmp_path, minilm_dir):
    """Several documents need an end-of-text token between them; MiniLM's WordPiece vocabulary has none."""
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": f"document {n} " * 20}) + "\n" for n in range(3)))
    config = from_dict({"task": {"name": "causal_lm"}, "data": {"train_file": str(tmp_path / "docs.jsonl"),
                                                                "max_length": 8, "cache_dir": str(tmp_path / "c")}})
    with pytest.raises(TpuplexError, match=r"has no end-of-text token to mark where each document of .*docs.jsonl "
                                           r"ends \(<\|endoftext\|>, .*\): use a tokenizer that has one"):
        TASK.prepare(config, Options(), minilm_dir)
    assert not any((tmp_path / "c").glob("*/manifest.json"))


def test_a_text_file_of_blank_lines_is_refused_whatever_the_tokenizer(tmp_path, minilm_dir):
    (tmp_path / "blank.txt").write_text("\n   \n\n")
    for tokenizer in ("checkpoint", "characters"):
        config = from_dict({"task": {"name": "causal_lm", "tokenizer": tokenizer},
                            "data": {"train_file": str(tmp_path / "blank.txt"), "max_length": 8,
                                     "cache_dir": str(tmp_path / "c")}})
        with pytest.raises(TpuplexError, match=r"blank.txt has no text \(data.train_file\)"):
            TASK.prepare(config, Options(tokenizer=tokenizer), minilm_dir)


def test_two_eval_files_of_one_name_are_refused_naming_both(tmp_path):
    """A split is named after its file, for every task: two held.txt files would be one split (one used to be
    dropped without a word)."""
    for folder in ("a", "b", "."):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / ("held.txt" if folder != "." else "input.txt")).write_text("abcdefgh" * 20)
    config = from_dict({"task": {"name": "causal_lm", "tokenizer": "characters"},
                        "data": {"train_file": str(tmp_path / "input.txt"), "max_length": 10,
                                 "eval_files": [str(tmp_path / "a" / "held.txt"), str(tmp_path / "b" / "held.txt")],
                                 "cache_dir": str(tmp_path / "cache")}})
    options = Options(tokenizer="characters")
    TASK.check(config, options)
    with pytest.raises(TpuplexError, match=r"data.eval_files\[0\] = '.*/a/held.txt' and data.eval_files\[1\] = "
                                           r"'.*/b/held.txt' would both be the split 'held'"):
        TASK.prepare(config, options, tmp_path)


@pytest.mark.parametrize(("records", "message"), [
    ([{"text": "abc def"}, {"text": ["a", "list"]}], r"line 2 after byte 0: its 'text' is a list, not text"),
    ([{"text": "abc def"}, {"text": 42}], r"line 2 after byte 0: its 'text' is a int, not text"),
    ([{"text": "abc def"}, {"Text": "abc"}], r"line 2 after byte 0 has no 'text' field \(it has 'Text'\): set "
                                              r"task.text_column"),
])
def test_a_jsonl_record_without_text_is_refused_naming_its_line(tmp_path, records, message):
    """Records whose text is a list or a number, or under another field, are refused: they used to train on the
    Python spelling of the value, or be skipped without a word."""
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records * 20))
    config = from_dict({"task": {"name": "causal_lm", "tokenizer": "characters"},
                        "data": {"train_file": str(tmp_path / "corpus.jsonl"), "max_length": 10,
                                 "cache_dir": str(tmp_path / "cache")}})
    options = Options(tokenizer="characters")
    with pytest.raises(TpuplexError, match=message):
        TASK.check(config, options)
        TASK.prepare(config, options, tmp_path)


def test_a_from_scratch_config_without_vocab_size_takes_the_tokenizers(tmp_path, minilm_dir):
    """nanoGPT sizes its vocabulary from the text (meta.pkl): a config.json that leaves vocab_size out gets the
    run's characters and end-of-text, or the checkpoint tokenizer's size; a task whose data has no tokenizer size
    is told to set it."""
    model = tmp_path / "gpt"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 16, "n_embd": 8,
                                                   "n_layer": 1, "n_head": 2}))
    (tmp_path / "input.txt").write_text("to be, or not to be\n" * 20)
    for tokenizer, size in (("characters", len(set("to be, or not to be\n")) + 1), ("checkpoint", 30522)):
        config = from_dict({"task": {"name": "causal_lm", "tokenizer": tokenizer},
                            "model": {"checkpoint": str(model)},
                            "data": {"train_file": str(tmp_path / "input.txt"), "max_length": 8,
                                     "cache_dir": str(tmp_path / "cache")}})
        kind = kinds.resolve(config, TASK)
        assert kind.arch.vocab_size == 0
        options = Options(tokenizer=tokenizer)
        data = TASK.prepare(config, options, minilm_dir)
        kind.check_data(data)
        assert kind.arch.vocab_size == kind.hf_config["vocab_size"] == size
        assert kind.spec(config, TASK, data).params[
            "transformer.wte.weight"].shape == (size, 8)
    with pytest.raises(TpuplexError, match=r"gpt/config.json has no vocab_size and the run's tokenizer gives it "
                                           r"none: set vocab_size there"):
        kinds.resolve(config, TASK).check_data(TaskData())


def test_random_window_steps_read_no_rows(tmp_path):
    """Under random-window sampling the Batcher's rows only count the epoch's steps: none is read (the step's
    tokens are the windows `random_windows` draws); sizes and fingerprint are the stream's."""
    (tmp_path / "input.txt").write_text("to be, or not to be\n" * 20)
    config = from_dict({"task": {"name": "causal_lm", "tokenizer": "characters", "sampling": "random_windows"},
                        "data": {"train_file": str(tmp_path / "input.txt"), "max_length": 8,
                                 "cache_dir": str(tmp_path / "cache")}})
    data = TASK.prepare(config, Options(tokenizer="characters", sampling="random_windows"), tmp_path)
    slots, stream = data.train, data.windows
    assert isinstance(slots, WindowSlots) and not isinstance(stream, WindowSlots)
    assert (len(slots), slots.fingerprint(), slots.token_count) == (len(stream), stream.fingerprint(),
                                                                    stream.token_count)
    rows = slots.rows(np.arange(3), 9)
    assert not rows["input_ids"].any() and rows["attention_mask"].all()
    batch = data.train_batch({**rows, "weight": np.ones(3, np.float32)}, step=1)
    assert batch["input_ids"].shape == (3, 8) and batch["input_ids"].any()


def test_a_character_vocabulary_is_written_as_a_tokenizer_giving_its_ids(tmp_path) -> None:
    """A character-level run's HF export carries its vocabulary as tokenizer.json: each character its run's id,
    whitespace and repeated characters kept, the text decoded back as it was, end-of-text the last id."""
    from tokenizers import Tokenizer

    text = "ROMEO:\nO Juliet,  thou art fair!\t1\n\n"
    vocabulary = Characters.of([text])
    vocabulary.save_pretrained(tmp_path)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ids = tokenizer.encode(text).ids
    assert ids == vocabulary.encode(text, "the text").tolist() and tokenizer.decode(ids) == text
    assert tokenizer.token_to_id("<|endoftext|>") == vocabulary.end_of_text
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"

"""Chat and instruction data for causal_lm (`tpuplex.tasks.causal_lm.chat`): conversations rendered by the
checkpoint's chat template, one row each, the loss on the answers alone; each bad conversation one line naming its
line number."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from chat_data import conversation, write_jsonl, write_tokenizer
from tokenizers import Tokenizer

from tpuplex.config import from_dict
from tpuplex.data import progress
from tpuplex.data.batching import Encoded
from tpuplex.errors import TpuplexError
from tpuplex.tasks.causal_lm import TASK, Options, chat


def answers_of(encoded, tokenizer_dir: Path) -> list[str]:
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return [tokenizer.decode([int(i) for i in ids[:n][mask[:n] > 0]], skip_special_tokens=False)
            for ids, mask, n in zip(encoded.input_ids, encoded.labels, encoded.lengths, strict=True)]


def encode_file(path: Path, tokenizer_dir: Path, max_length: int) -> Encoded:
    return chat.encode(chat.jsonl_records(path, "data.train_file"), f"{path} (data.train_file)", tokenizer_dir,
                       max_length)


def test_only_the_answers_carry_weight(tmp_path) -> None:
    tokenizer_dir = write_tokenizer(tmp_path / "tokenizer")
    two_turns = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                              {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
                              {"role": "assistant", "content": "6"}]}
    review = {"prompt": "Review: great film. Sentiment:", "completion": " positive"}
    path = write_jsonl(tmp_path / "chat.jsonl", [conversation("Capital of France?", "Paris."), two_turns, review])
    assert chat.is_chat(path)
    encoded = encode_file(path, tokenizer_dir, 96)
    assert encoded.input_ids.shape == (3, 97) and encoded.labels.shape == (3, 97)
    assert answers_of(encoded, tokenizer_dir) == ["Paris.<|im_end|>\n", "4<|im_end|>\n6<|im_end|>\n",
                                                  " positive<|im_end|>"]
    width = chat.answer_width([encoded])
    rows = chat.answer_rows({**encoded.rows(np.arange(3), 97), "weight": np.array([1, 1, 0], np.float32)}, width)
    answers = encoded.labels[:, 1:] > 0  # next-token targets: one on from the inputs
    assert width == answers.sum(axis=1).max() < 96
    assert rows["input_ids"].shape == (3, 96)
    assert rows["target_positions"].shape == rows["labels"].shape == rows["weight"].shape == (3, width)
    # Rows 0 and 1: each answer target in order, at the input before it, then empty slots; row 2 weighs nothing.
    for row in range(2):
        count, at = answers[row].sum(), np.flatnonzero(answers[row])
        np.testing.assert_array_equal(rows["target_positions"][row], np.pad(at, (0, width - count)))
        np.testing.assert_array_equal(rows["labels"][row], np.pad(encoded.input_ids[row, 1:][at], (0, width - count)))
        np.testing.assert_array_equal(rows["weight"][row], np.arange(width) < count)
    assert not rows["weight"][2].any()


def test_the_last_conversations_are_held_out(tmp_path) -> None:
    tokenizer_dir = write_tokenizer(tmp_path / "tokenizer")
    path = write_jsonl(tmp_path / "chat.jsonl", [conversation(f"q{i}", f"a{i}") for i in range(10)])
    config = from_dict({"task": {"name": "causal_lm", "tokenizer": "checkpoint", "validation_fraction": 0.2},
                        "data": {"train_file": str(path), "max_length": 32}})
    options = Options(tokenizer="checkpoint", validation_fraction=0.2)
    TASK.check(config, options)
    data = TASK.prepare(config, options, tokenizer_dir)
    assert len(data.train) == 8 and len(data.eval["validation"]) == 2 and data.answer_width == 4  # "a8<|im_end|>\n"
    assert answers_of(data.eval["validation"], tokenizer_dir) == ["a8<|im_end|>\n", "a9<|im_end|>\n"]


BAD = {
    "a malformed line": (['{"messages": [{"role": "user", "content": "hi"}'], r"chat.jsonl:1 \(data.train_file\) is "
                                                                              r"not a JSON record"),
    "no assistant turn": ([{"messages": [{"role": "user", "content": "hi"}]}], r"chat.jsonl:1 .* no assistant turn"),
    "an unknown role": ([{"messages": [{"role": "robot", "content": "hi"}]}], r"\"messages\" must be a list of"),
    "a record of another kind": ([conversation("a", "b"), {"text": "plain"}], r"chat.jsonl:2 .* not a conversation"),
    "an answer past the longest row": ([conversation("q", "a" * 100)], r"chat.jsonl:1 .* is 1\d\d tokens long, more "
                                                                        r"than data.max_length \+ 1 = 33"),
    "an empty completion": ([{"prompt": "q", "completion": ""}], r"the completion not empty"),
    "only empty answers": ([conversation("a", "b"), conversation("q", "")], r"chat.jsonl:2 .*: every assistant "
                                                                            r"answer is empty"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_a_bad_conversation_is_one_line_naming_it(tmp_path, case) -> None:
    records, message = BAD[case]
    path = write_jsonl(tmp_path / "chat.jsonl", records)
    with pytest.raises(TpuplexError, match=message):
        encode_file(path, write_tokenizer(tmp_path / "tokenizer"), 32)


def test_a_byte_order_mark_is_read_past_and_a_byte_not_utf8_named_by_its_line(tmp_path) -> None:
    tokenizer_dir = write_tokenizer(tmp_path / "tokenizer")
    path = write_jsonl(tmp_path / "chat.jsonl", [conversation("q", "a"), conversation("r", "b")])
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # as Notepad saves UTF-8
    assert chat.is_chat(path)
    assert answers_of(encode_file(path, tokenizer_dir, 32), tokenizer_dir) == ["a<|im_end|>\n", "b<|im_end|>\n"]
    path.write_bytes(path.read_bytes().replace(b'"r"', b'"\xe9"'))  # latin-1's é on line 2
    with pytest.raises(TpuplexError, match=r"chat.jsonl is not UTF-8 text \(byte 0xe9 on line 2\)"):
        encode_file(path, tokenizer_dir, 32)


def test_a_chat_template_that_is_not_jinja2_is_one_line_naming_its_file(tmp_path) -> None:
    tokenizer_dir = write_tokenizer(tmp_path / "tokenizer", template="{% for message in messages %}{{ message")
    path = write_jsonl(tmp_path / "chat.jsonl", [conversation("q", "a")])
    with pytest.raises(TpuplexError, match=r"the chat_template of .*tokenizer_config.json is not a jinja2 template"):
        encode_file(path, tokenizer_dir, 32)
    with pytest.raises(TpuplexError, match=r"is not a jinja2 template"):
        chat.user_turn(tokenizer_dir)  # tpuplex generate --chat


def test_messages_without_a_chat_template_are_refused_and_prompts_are_not(tmp_path) -> None:
    tokenizer_dir = write_tokenizer(tmp_path / "tokenizer", template=None)
    with pytest.raises(TpuplexError, match=r"the checkpoint's tokenizer has no chat template"):
        encode_file(write_jsonl(tmp_path / "chat.jsonl", [conversation("q", "a")]), tokenizer_dir, 32)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "q:", "completion": "a"}])
    assert answers_of(encode_file(pairs, tokenizer_dir, 32), tokenizer_dir) == ["a<|im_end|>"]


def test_conversations_train_with_the_checkpoints_tokenizer(tmp_path) -> None:
    path = write_jsonl(tmp_path / "chat.jsonl", [conversation("q", "a")])
    config = from_dict({"task": {"name": "causal_lm", "tokenizer": "characters"},
                        "data": {"train_file": str(path), "max_length": 32}})
    with pytest.raises(TpuplexError, match=r"holds conversations: they train with task.tokenizer = \"checkpoint\""):
        TASK.check(config, Options(tokenizer="characters"))


def test_answer_accuracy_counts_conversations_whose_every_answer_token_is_the_argmax() -> None:
    weight = np.array([[0, 1, 1, 0], [0, 0, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]], np.float32)
    right = np.array([[0, 1, 1, 0], [1, 1, 0, 1], [1, 0, 0, 0], [1, 1, 1, 1]], np.float32)  # row 0: a wrong prompt
    outputs = np.stack([np.zeros_like(right), right], axis=-1)                                # token, not counted
    assert chat.answer_accuracy(outputs, weight) == 2 / 3  # rows 0 and 2 right, row 1 not; row 3 holds no answer


SST2_PROMPT = "Review: {{ sentence }}\nPositive or negative?"
SST2_ANSWER = "{{ ['negative', 'positive'][label | int] }}"


def test_a_table_becomes_conversations_by_its_templates(tmp_path) -> None:
    """task.prompt_template and task.answer_template (jinja2 over the columns) make each row of a table a
    conversation: the user's message and the answer, rendered by the chat template; the held-out file is a table
    too, its split named after it."""
    tokenizer_dir = write_tokenizer(tmp_path / "tokenizer")
    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngreat film\t1\ndull\t0\nfine\t1\n")
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\nawful\t0\n")
    task = {"name": "causal_lm", "tokenizer": "checkpoint", "prompt_template": SST2_PROMPT,
            "answer_template": SST2_ANSWER}
    config = from_dict({"task": task, "data": {"train_file": str(tmp_path / "train.tsv"), "max_length": 96,
                                               "eval_files": [str(tmp_path / "dev.tsv")]}})
    options = Options(tokenizer="checkpoint", prompt_template=SST2_PROMPT, answer_template=SST2_ANSWER)
    TASK.check(config, options)
    data = TASK.prepare(config, options, tokenizer_dir)
    assert data.answer_width and list(data.eval) == ["dev"]
    assert answers_of(data.train, tokenizer_dir) == ["positive<|im_end|>\n", "negative<|im_end|>\n",
                                                    "positive<|im_end|>\n"]
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    first = tokenizer.decode(data.train.input_ids[0, : data.train.lengths[0]].tolist(), skip_special_tokens=False)
    assert first.startswith("<|im_start|>user\nReview: great film\nPositive or negative?<|im_end|>")


@pytest.mark.parametrize(("prompt", "answer", "message"), [
    (SST2_PROMPT, "", r"task.prompt_template and task.answer_template make a table's rows conversations together"),
    ("{{ sentense }}", SST2_ANSWER, r"task.prompt_template reads the column 'sentense', which .*train.tsv "
                                    r"\(data.train_file\) does not have"),
    ("{{ sentence }}", "{{ ['a', 'b'][label | int + 5] }}", r"task.answer_template = .* cannot render .*train.tsv "
                                                             r"line 2"),
    ("{{ sentence", SST2_ANSWER, r"task.prompt_template = '\{\{ sentence' is not a jinja2 template"),
    (SST2_PROMPT, "{{ '' }}", r"train.tsv line 2 \(data.train_file\): task.answer_template renders an empty answer"),
])
def test_bad_templates_are_one_line(tmp_path, prompt, answer, message) -> None:
    tokenizer_dir = write_tokenizer(tmp_path / "tokenizer")
    (tmp_path / "train.tsv").write_text("sentence\tlabel\ngreat film\t1\ndull\t0\n")
    task = {"name": "causal_lm", "tokenizer": "checkpoint", "prompt_template": prompt, "answer_template": answer}
    config = from_dict({"task": task, "data": {"train_file": str(tmp_path / "train.tsv"), "max_length": 96}})
    options = Options(tokenizer="checkpoint", prompt_template=prompt, answer_template=answer)
    with pytest.raises(TpuplexError, match=message):
        TASK.check(config, options)
        TASK.prepare(config, options, tokenizer_dir)


def test_templates_over_a_file_of_conversations_are_refused_naming_what_to_remove(tmp_path) -> None:
    path = write_jsonl(tmp_path / "chat.jsonl", [conversation("q", "a")])
    task = {"name": "causal_lm", "tokenizer": "checkpoint", "prompt_template": SST2_PROMPT,
            "answer_template": SST2_ANSWER}
    config = from_dict({"task": task, "data": {"train_file": str(path), "max_length": 32}})
    with pytest.raises(TpuplexError, match=r"chat.jsonl' holds conversations already: remove task.prompt_template "
                                           r"and task.answer_template"):
        TASK.check(config, Options(tokenizer="checkpoint", prompt_template=SST2_PROMPT, answer_template=SST2_ANSWER))


def test_a_long_tokenization_says_how_far_it_is_and_a_short_one_nothing(tmp_path, monkeypatch, capsys) -> None:
    """Progress lines every TPUPLEX_PROGRESS_SECONDS (here each second of a clock that ticks a second a read), none
    when it is 0 (as in every test session), and none from a process other than 0."""
    tokenizer_dir = write_tokenizer(tmp_path / "tokenizer")
    path = write_jsonl(tmp_path / "chat.jsonl", [conversation(f"Say {w}.", w) for w in ["a", "b", "c"]])
    encode_file(path, tokenizer_dir, 64)
    assert capsys.readouterr().err == ""
    ticks = iter(range(100))
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: float(next(ticks))))
    monkeypatch.setenv(progress.SECONDS_ENV, "2")
    encode_file(path, tokenizer_dir, 64)
    lines = capsys.readouterr().err.splitlines()
    source = f"tokenizing {path} (data.train_file)"
    assert lines == [f"{source}: 2 conversations in 2 s (1 a second)", f"{source}: done, 3 conversations in 4 s"]
    monkeypatch.setenv("RANK", "1")
    encode_file(path, tokenizer_dir, 64)
    assert capsys.readouterr().err == ""


def test_progress_with_a_total_gives_the_share_and_the_time_left() -> None:
    out, ticks = io.StringIO(), iter([0.0, 5.0, 30.0, 31.0])
    counted = progress.Progress("tokenizing corpus/*.txt", "parts", total=40, every=10, clock=lambda: next(ticks),
                                out=out)
    counted.advance(4)  # 5 s: no line yet
    counted.advance(8)  # 30 s
    counted.close()
    assert out.getvalue().splitlines() == ["tokenizing corpus/*.txt: 12 of 40 parts (30%) in 30 s, about 70 s left",
                                           "tokenizing corpus/*.txt: done, 12 parts in 31 s"]
    assert progress.interval({}) == 10 and progress.interval({progress.SECONDS_ENV: "0"}) == 0

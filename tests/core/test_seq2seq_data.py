"""A text-to-text table read through the T5 example's tokenizer (`tpuplex.tasks.seq2seq`, no framework): rows
whose target is not text, templates that fail on a row, inputs cut to nothing, and characters the tokenizer has no
token for, each said in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpuplex.config import from_dict
from tpuplex.errors import TpuplexError
from tpuplex.tasks.seq2seq import TASK, Options

T5_TINY = Path(__file__).resolve().parents[2] / "examples" / "t5" / "t5-tiny"
ROWS = [{"question": "what is the river called", "answer": "the avon"},
        {"question": "who keeps the lamp", "answer": "the old man"}]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def prepared(tmp_path: Path, train: list[dict], dev: list[dict] = ROWS, max_length: int = 32,
             target: str = "{{ answer }}"):
    options = Options(input_template="question: {{ question }}", target_template=target)
    config = from_dict({"task": {"name": "seq2seq", "input_template": options.input_template,
                                 "target_template": target},
                        "data": {"train_file": str(write_jsonl(tmp_path / "train.jsonl", train)),
                                 "eval_files": [str(write_jsonl(tmp_path / "dev.jsonl", dev))],
                                 "max_length": max_length}})
    return TASK.prepare(config, options, T5_TINY)


@pytest.mark.parametrize(("answer", "shown"), [(None, "a null (null)"), ([1, 2], "a list ([1, 2])"),
                                               ({"text": "x"}, "an object ({'text': 'x'})")])
def test_a_target_that_is_not_text_is_refused_at_its_line(tmp_path, answer, shown) -> None:
    rows = [*ROWS, {"question": "which one", "answer": answer}]
    with pytest.raises(TpuplexError) as raised:
        prepared(tmp_path, rows)
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / 'train.jsonl'} line 3 (data.train_file): task.target_template = "
                              f"'{{{{ answer }}}}' prints {shown}, not text") and "\n" not in message


def test_a_row_without_the_target_s_field_is_refused_at_its_line(tmp_path) -> None:
    with pytest.raises(TpuplexError, match=r"train.jsonl line 3 has no field 'answer' \(it has question\): add it, or "
                                           r"write the file's names in the config .*the task's templates"):
        prepared(tmp_path, [*ROWS, {"question": "which one"}])


def test_a_template_that_fails_on_a_row_is_the_user_s_error_naming_it_and_the_row(tmp_path) -> None:
    with pytest.raises(TpuplexError, match=r"task.target_template = '\{\{ answer / 0 \}\}' cannot render "
                                           r".*train.jsonl line 1 \(data.train_file\) \(TypeError: unsupported"):
        prepared(tmp_path, ROWS, target="{{ answer / 0 }}")


def test_a_list_made_text_by_the_template_is_read(tmp_path) -> None:
    rows = [{"question": "name two", "answer": ["the", "avon"]}] * 2
    data = prepared(tmp_path, rows, dev=rows, target='{{ answer | join(" ") }}')
    assert data.vocabulary.tokenizer.decode([int(i) for i in data.train.labels[0] if i > 1]) == "the avon"


def test_a_max_length_that_leaves_only_end_of_text_is_refused_and_a_cut_is_said(tmp_path, capfd) -> None:
    with pytest.raises(TpuplexError, match=r"^data.max_length = 1 cuts every training input to its end-of-text "
                                           r"token alone.*the longest input is \d+ tokens"):
        prepared(tmp_path, ROWS, max_length=1)
    data = prepared(tmp_path, ROWS, max_length=4)
    said = capfd.readouterr().err.splitlines()
    assert data.report()["inputs_cut_to_max_length"] == 4
    assert [line for line in said if "are cut" in line] == [
        "tpuplex: 4 of 4 inputs are longer than data.max_length = 4 tokens and are cut (their end-of-text kept; the "
        "longest is 11 tokens): raise data.max_length to read them whole"]


def test_characters_the_tokenizer_lacks_are_counted_not_dropped_unsaid(tmp_path, capfd) -> None:
    """The T5 example's tokenizer, trained on Shakespeare, has no digits or double quotes: a held-out text with
    them is read with its unknown token in their place, and the run says how many there were."""
    held_out = [{"question": 'he said "100 percent" of sentence1', "answer": "the avon"}, *ROWS]
    data = prepared(tmp_path, ROWS, dev=held_out)
    assert data.report()["unknown_characters"] == 6
    assert ('tpuplex: the tokenizer has no token for 6 character(s) of the data (\'"01\'): they are read as its '
            "unknown token") in capfd.readouterr().err
    unknown = data.vocabulary.unknown_id
    assert [int((row == unknown).sum()) for row in data.eval["dev"].input_ids] == [6, 0, 0]

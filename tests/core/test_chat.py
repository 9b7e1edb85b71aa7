"""Chat and instruction data for causal_lm (`tpuplex.tasks.causal_lm.chat`): conversations rendered by the
checkpoint's chat template, one row each, the loss on the answers alone; each bad conversation one line naming its
line number."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from chat_data import conversation, write_jsonl, write_tokenizer
from tokenizers import Tokenizer

from tpuplex.config import from_dict
from tpuplex.errors import TpuplexError
from tpuplex.tasks.causal_lm import TASK, Options, chat


def answers_of(encoded, tokenizer_dir: Path) -> list[str]:
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return [tokenizer.decode([int(i) for i in ids[:n][mask[:n] > 0]], skip_special_tokens=False)
            for ids, mask, n in zip(encoded.input_ids, encoded.labels, encoded.lengths, strict=True)]


def test_only_the_answers_carry_weight(tmp_path) -> None:
    tokenizer_dir = write_tokenizer(tmp_path / "tokenizer")
    two_turns = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                              {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
                              {"role": "assistant", "content": "6"}]}
    review = {"prompt": "Review: great film. Sentiment:", "completion": " positive"}
    path = write_jsonl(tmp_path / "chat.jsonl", [conversation("Capital of France?", "Paris."), two_turns, review])
    assert chat.is_chat(path)
    encoded = chat.encode(path, "data.train_file", tokenizer_dir, 96)
    assert encoded.input_ids.shape == (3, 97) and encoded.labels.shape == (3, 97)
    assert answers_of(encoded, tokenizer_dir) == ["Paris.<|im_end|>\n", "4<|im_end|>\n6<|im_end|>\n",
                                                  " positive<|im_end|>"]
    rows = chat.answer_rows({**encoded.rows(np.arange(3), 97), "weight": np.ones(3, np.float32)})
    assert rows["input_ids"].shape == rows["labels"].shape == rows["weight"].shape == (3, 96)
    # The weighted targets are the answers' tokens (next-token targets: one on from the inputs).
    answers = encoded.labels[:, 1:] > 0
    np.testing.assert_array_equal(rows["labels"][rows["weight"] > 0], encoded.input_ids[:, 1:][answers])


def test_the_last_conversations_are_held_out(tmp_path) -> None:
    tokenizer_dir = write_tokenizer(tmp_path / "tokenizer")
    path = write_jsonl(tmp_path / "chat.jsonl", [conversation(f"q{i}", f"a{i}") for i in range(10)])
    config = from_dict({"task": {"name": "causal_lm", "tokenizer": "checkpoint", "validation_fraction": 0.2},
                        "data": {"train_file": str(path), "max_length": 32}})
    options = Options(tokenizer="checkpoint", validation_fraction=0.2)
    TASK.check(config, options)
    data = TASK.prepare(config, options, tokenizer_dir)
    assert len(data.train) == 8 and len(data.eval["validation"]) == 2 and data.answers
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
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_a_bad_conversation_is_one_line_naming_it(tmp_path, case) -> None:
    records, message = BAD[case]
    path = write_jsonl(tmp_path / "chat.jsonl", records)
    with pytest.raises(TpuplexError, match=message):
        chat.encode(path, "data.train_file", write_tokenizer(tmp_path / "tokenizer"), 32)


def test_messages_without_a_chat_template_are_refused_and_prompts_are_not(tmp_path) -> None:
    tokenizer_dir = write_tokenizer(tmp_path / "tokenizer", template=None)
    with pytest.raises(TpuplexError, match=r"the checkpoint's tokenizer has no chat template"):
        chat.encode(write_jsonl(tmp_path / "chat.jsonl", [conversation("q", "a")]), "data.train_file",
                    tokenizer_dir, 32)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "q:", "completion": "a"}])
    assert answers_of(chat.encode(pairs, "data.train_file", tokenizer_dir, 32), tokenizer_dir) == ["a<|im_end|>"]


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

"""T5 on the torch backend, at a small size (the tests are tests/common/t5_checks.py's)."""

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import backend as torch_backend
from t5_checks import (  # noqa: F401  (collected here)
    test_generation_matches_transformers,
    test_logits_match_transformers,
)

import tpuplex


@pytest.fixture(scope="module")
def backend():
    return torch_backend()


T5_TINY = Path(__file__).resolve().parents[2] / "examples" / "t5" / "t5-tiny"
WORDS = "apple river stone cloud tiger lamp music garden paper window".split()


def reversal_table(path: Path, rows: int, seed: int) -> Path:
    """A table of word sequences and their reversals (a unit test's synthetic task, learnable in a few steps)."""
    rng = np.random.default_rng(seed)
    with path.open("w") as handle:
        for _ in range(rows):
            words = list(rng.choice(WORDS, rng.integers(1, 4)))
            handle.write(json.dumps({"words": " ".join(words), "reversed": " ".join(reversed(words))}) + "\n")
    return path


def reversal_config(tmp_path: Path, **train) -> dict:
    checkpoint = tmp_path / "t5"
    shutil.copytree(T5_TINY, checkpoint)
    return {"model": {"checkpoint": str(checkpoint), "dropout": False},
            "task": {"name": "seq2seq", "input_template": "reverse: {{ words }}", "target_template": "{{ reversed }}"},
            "data": {"train_file": str(reversal_table(tmp_path / "train.jsonl", 256, 0)),
                     "eval_files": [str(reversal_table(tmp_path / "dev.jsonl", 48, 1))], "max_length": 16},
            "train": {"learning_rate": 3e-3, "max_steps": 60, "global_batch": 16, "seed": 0, **train},
            "runtime": {"output_dir": str(tmp_path / "run"), "log_every": 60}}


def test_exact_match_is_what_greedy_decoding_writes(tmp_path: Path) -> None:
    """A seq2seq run's `exact_match` (every target token the most likely one given the ones before it) is the share
    of rows whose greedily written text is the target: `predict` writes those texts, `Run.predict` one of them."""
    run = tpuplex.train(tpuplex.Config.from_dict(reversal_config(tmp_path)), "torch")
    metrics = run.results["metrics"]["dev"]
    assert 0 < metrics["exact_match"] < 1 and metrics["token_accuracy"] > metrics["exact_match"]
    with run.write_predictions("dev")["dev"].open() as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(rows) == 48
    assert np.mean([row["prediction"] == row["target"] for row in rows]) == pytest.approx(metrics["exact_match"])
    assert run.predict(rows[0]["input"]) == rows[0]["prediction"]


@pytest.mark.parametrize(("change", "message"), [
    ({"task": {"target_template": ""}}, "set both"),
    ({"task": {"max_target_length": 2}}, "raise it to at least"),
    ({"task": {"input_template": "{{ nope }}"}}, "nope"),
])
def test_bad_text_to_text_input_is_one_line(tmp_path: Path, change: dict, message: str) -> None:
    config = reversal_config(tmp_path)
    for section, fields in change.items():
        config[section] = {**config[section], **fields}
    with pytest.raises(tpuplex.TpuplexError, match=message):
        tpuplex.train(tpuplex.Config.from_dict(config), "torch")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_characters_the_tokenizer_lacks_are_counted_and_generate_options_typed(tmp_path: Path, capfd) -> None:
    """The T5 example's tokenizer (trained on Shakespeare) has no digits or double quotes: a held-out text with them
    is counted in the run's output and results.json, and so are a prompt's in generation, which writes the rest."""
    config = reversal_config(tmp_path, max_steps=2, global_batch=8)
    held_out = tmp_path / "dev.jsonl"
    held_out.write_text(json.dumps({"words": 'apple "100" river', "reversed": "river apple"}) + "\n")
    run = tpuplex.train(tpuplex.Config.from_dict(config), "torch")
    assert run.results["data"]["unknown_characters"] == 5
    assert "tpuplex: the tokenizer has no token for 5 character(s) of the data" in capfd.readouterr().err
    assert isinstance(run.generate('reverse: "42" apple', tokens=4), str)
    assert ("tpuplex: the tokenizer has no token for 4 character(s) of the prompts ('\"24'): they are read as its "
            "unknown token and do not come back in written text") in capfd.readouterr().err
    assert isinstance(run.predict("reverse: 7 apple"), str)
    assert "the tokenizer has no token for 1 character(s) of the inputs ('7')" in capfd.readouterr().err
    with pytest.raises(tpuplex.TpuplexError, match=r"^temperature = 'hot' is a str: temperature \(--temperature\) "
                                                   r"takes a number \(float\)$"):
        run.generate("reverse: apple", temperature="hot")

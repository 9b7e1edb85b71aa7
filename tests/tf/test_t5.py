"""T5 on the tf backend, at a small size (the tests are tests/common/t5_checks.py's)."""

import json
import shutil
from pathlib import Path

import pytest
from t5_checks import (  # noqa: F401  (collected here)
    test_generation_matches_transformers,
    test_logits_match_transformers,
    test_training_follows_torch,
)

import tpuplex
from tpuplex.config import RuntimeConfig
from tpuplex_tf.backend import TfBackend


@pytest.fixture(scope="module")
def backend():
    return TfBackend(RuntimeConfig(cpu_devices=2))


def test_a_saved_model_of_a_t5_run_is_refused_in_one_line(tmp_path: Path) -> None:
    """T5's relative-position buckets need static lengths, which a SavedModel signature does not give: the export
    stops with one line naming what works instead, and writes nothing."""
    checkpoint = tmp_path / "t5"
    shutil.copytree(Path(__file__).resolve().parents[2] / "examples" / "t5" / "t5-tiny", checkpoint)
    rows = [{"words": words, "reversed": " ".join(reversed(words.split()))} for words in ("a b", "c d e", "f")] * 8
    for split in ("train", "dev"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = tpuplex.train(tpuplex.Config.from_dict({
        "model": {"checkpoint": str(checkpoint), "dropout": False},
        "task": {"name": "seq2seq", "input_template": "reverse: {{ words }}", "target_template": "{{ reversed }}"},
        "data": {"train_file": str(tmp_path / "train.jsonl"), "eval_files": [str(tmp_path / "dev.jsonl")],
                 "max_length": 8},
        "train": {"max_steps": 1, "global_batch": 8}, "runtime": {"output_dir": str(tmp_path / "run")}}), "tf")
    with pytest.raises(tpuplex.TpuplexError, match=r"no SavedModel export yet: use tpuplex export RUN --format hf"):
        run.export("saved_model", tmp_path / "saved")
    assert not (tmp_path / "saved").exists()

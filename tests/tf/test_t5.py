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


def test_a_t5_saved_model_decodes_as_tpuplex_generate_does(tmp_path: Path) -> None:
    """`tpuplex export RUN --format saved_model` of a text-to-text run: token ids at the run's input length in,
    greedy decoding in the graph, the same texts as `Run.generate` (the host's search over compiled steps)."""
    import numpy as np
    import tensorflow as tf
    from tokenizers import Tokenizer

    checkpoint = tmp_path / "t5"
    shutil.copytree(Path(__file__).resolve().parents[2] / "examples" / "t5" / "t5-tiny", checkpoint)
    rows = [{"words": words, "reversed": " ".join(reversed(words.split()))} for words in ("a b", "c d e", "f")] * 8
    for split in ("train", "dev"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = tpuplex.train(tpuplex.Config.from_dict({
        "model": {"checkpoint": str(checkpoint), "dropout": False},
        "task": {"name": "seq2seq", "input_template": "reverse: {{ words }}", "target_template": "{{ reversed }}"},
        "data": {"train_file": str(tmp_path / "train.jsonl"), "eval_files": [str(tmp_path / "dev.jsonl")],
                 "max_length": 16},
        "train": {"max_steps": 2, "global_batch": 8, "learning_rate": 1e-2},
        "runtime": {"output_dir": str(tmp_path / "run"), "cpu_devices": 1}}), "tf")
    served = tf.saved_model.load(str(run.export("saved_model", tmp_path / "saved"))).signatures["serving_default"]
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    prompts = ["reverse: a b", "reverse: c d e f", "reverse: f"]
    ids = np.zeros((len(prompts), 16), np.int32)
    for row, prompt in enumerate(prompts):
        encoded = tokenizer.encode(prompt).ids  # its tokens, then </s>
        ids[row, :len(encoded)] = encoded
    sequences = served(input_ids=tf.constant(ids), attention_mask=tf.constant((ids > 0).astype(np.int32)))
    sequences = sequences["sequences"].numpy()
    texts = [tokenizer.decode(list(row[:np.flatnonzero(np.append(row == 1, True))[0]])) for row in sequences]
    assert texts == run.generate(prompts, tokens=sequences.shape[1])
    assert sequences.shape == (3, max(len(tokenizer.encode(row["reversed"]).ids) for row in rows))

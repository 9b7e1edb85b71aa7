"""The masked-LM task's framework-free half: packing real text, the core's masks, its config, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tpuplex import config
from tpuplex.commands import cli
from tpuplex.data.batching import Batcher
from tpuplex.tasks.masked_lm import data as text

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_shakespeare_packs_into_full_rows(shared_text, minilm_dir):
    """Every row but the last is full: real tokens / all tokens >= 0.99 with one static shape."""
    lines = (shared_text / "tinyshakespeare" / "input.txt").read_text().splitlines()
    documents = [line.strip() for line in lines if line.strip()]
    packed = text.encode_packed(documents, text.untruncated_tokenizer(minilm_dir, 128), 128, "tiny shakespeare")
    assert np.all(packed.lengths[:-1] == 128) and 0 < packed.lengths[-1] <= 128
    batcher = Batcher(packed, 32, 1, seed=0)
    assert batcher.padding_efficiency(train=True) >= 0.99
    assert {batch["input_ids"].shape for batch in batcher.train_batches(0)} == {(32, 128)}


def test_masks_choose_15_percent_of_each_row_and_never_special_tokens(minilm_dir):
    tokenizer = text.untruncated_tokenizer(minilm_dir, 128)
    special, mask = text.special_ids(tokenizer), text.mask_id(tokenizer, minilm_dir)
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, (64, 128)).astype(np.int32)
    ids[:, 0], ids[:, 60], ids[:, 127] = 101, 102, 102  # [CLS] and [SEP] inside packed rows
    attention = np.ones_like(ids)
    attention[-1, 100:] = 0  # a short last row: 97 maskable tokens
    row_weight = np.ones(64, np.float32)
    row_weight[-1] = 0.0
    masked = text.mask_tokens(ids, attention, row_weight, np.random.default_rng([7, 0, 3]), 0.15, mask, 30522,
                              special)
    positions, used = masked["masked_positions"], masked["weight"] > 0
    assert positions.shape == masked["labels"].shape == (64, text.prediction_slots(128, 0.15)) == (64, 19)
    assert np.array_equal(used.sum(axis=1)[:-1], np.full(63, 19)) and not used[-1].any()  # 125 * 0.15 = 18.75
    chosen = np.zeros(ids.shape, bool)  # the last row's weight is 0: nothing of it counts
    for row in range(63):
        row_positions = positions[row][used[row]]
        assert np.all(np.diff(row_positions) > 0) and not np.isin(row_positions, [0, 60, 127]).any()
        chosen[row, row_positions] = True
    assert np.array_equal(masked["labels"][used], ids[:-1][chosen[:-1]])
    assert np.array_equal(masked["input_ids"][:-1][~chosen[:-1]], ids[:-1][~chosen[:-1]])
    assert 0.75 < np.mean(masked["input_ids"][chosen] == mask) < 0.85
    assert 0.05 < np.mean(masked["input_ids"][chosen] == ids[chosen]) < 0.15  # kept (and a few drawn equal)
    short = text.mask_tokens(ids[-1:], attention[-1:], np.ones(1, np.float32), np.random.default_rng(1), 0.15, mask,
                             30522, special)
    assert int(short["weight"].sum()) == 15 and np.all(short["masked_positions"][0, :15] < 100)  # round(97 * 0.15)
    again = text.mask_tokens(ids, attention, row_weight, np.random.default_rng([7, 0, 3]), 0.15, mask, 30522, special)
    assert all(np.array_equal(again[key], masked[key]) for key in masked)


def test_the_example_config_loads_and_its_options_are_part_of_the_hash():
    path = ROOT / "examples" / "mlm" / "tinyshakespeare.toml"
    loaded = config.load(path)
    assert loaded.task.name == "masked_lm" and loaded.task.options["mask_probability"] == 0.15
    assert config.load(path, ["task.mask_probability=0.2"]).hash() != loaded.hash()
    assert config.from_dict(loaded.to_dict()) == loaded


def mlm_config(tmp_path: Path, model: Path, train_file: Path, **task: object) -> Path:
    options = "".join(f"{name} = {json.dumps(value)}\n" for name, value in task.items())
    path = tmp_path / "mlm.toml"
    path.write_text(f'[task]\nname = "masked_lm"\n{options}[model]\ncheckpoint = "{model}"\n'
                    f'[data]\ndataset = "corpus"\ntrain_file = "{train_file}"\nmax_length = 32\n'
                    f'cache_dir = "{tmp_path / "cache"}"\n[train]\nmax_steps = 1\nglobal_batch = 8\n'
                    f'[runtime]\noutput_dir = "{tmp_path / "run"}"\n')
    return path


@pytest.mark.parametrize(("case", "fragment"), [
    ("an empty text file", "has no text (data.train_file)"),
    ("text shorter than one row", "fewer than one row of data.max_length = 32"),
    ("a tokenizer without a mask token", "has no mask token ([MASK] or <mask>)"),
    ("a model with no MLM head", "the masked_lm task cannot train a model of your own"),
    ("an unknown task option", "unknown config field task.mask_rate"),
    ("a mask probability of 1", "task.mask_probability = 1.0 is not allowed"),
])
def test_bad_masked_lm_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, minilm_dir, case, fragment):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("" if case == "an empty text file" else
                      "A few words.\nNot many.\n" if case == "text shorter than one row" else
                      "To be, or not to be, that is the question.\n" * 400)
    model = minilm_dir
    if case == "a tokenizer without a mask token":
        model = tmp_path / "no-mask"
        model.mkdir()
        (model / "config.json").write_text((minilm_dir / "config.json").read_text())
        (model / "tokenizer.json").write_text((minilm_dir / "tokenizer.json").read_text().replace("[MASK]", "[HIDE]"))
    task = ({"mask_rate": 0.1} if case == "an unknown task option" else
            {"mask_probability": 1.0} if case == "a mask probability of 1" else {})
    path = mlm_config(tmp_path, model, corpus, **task)
    extra = ["--set", 'model.architecture="textcnn:TextCNN"'] if case == "a model with no MLM head" else []
    code = cli.main(["train", str(path), "--backend", "numpy", *extra])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tpuplex:")]
    assert code == 2 and len(errors) == 1 and errors[0].startswith("tpuplex: error: "), errors
    assert fragment in errors[0], errors[0]
    assert not (tmp_path / "run").exists()

"""Token classification through the workflow, each command in a fresh process: a run trained on torch on real
WNUT-17 (a tiny random BERT reading MiniLM's tokenizer, max_length 32 so that long sentences are cut) evaluates on
jax and tf with the trainer's metrics, predicts one line per input word, and exports an HF folder that
`AutoModelForTokenClassification` loads with tpuplex's logits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fresh_process import LOGIT_TOLERANCE, METRIC_TOLERANCE, run_python, tpuplex
from tiny_glue import write_tiny_model_reading

from tpuplex.commands import run_folder, workflow
from tpuplex.tasks.token_classification import data as tagged

pytestmark = pytest.mark.started_first

MAX_LENGTH = 32
SPLITS = {"emerging.dev": "emerging.dev.conll", "emerging.test": "emerging.test.annotated"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, minilm_dir, shared_text) -> Path:
    folder, wnut = tmp_path_factory.mktemp("ner"), shared_text / "wnut17"
    model = write_tiny_model_reading(folder / "model", minilm_dir)
    config = folder / "config.toml"
    evaluation = ", ".join(f'"{wnut / name}"' for name in SPLITS.values())
    config.write_text(f'[task]\nname = "token_classification"\n[model]\ncheckpoint = "{model}"\n'
                      f'[data]\ndataset = "wnut17"\ntrain_file = "{wnut / "wnut17train.conll"}"\n'
                      f'eval_files = [{evaluation}]\nmax_length = {MAX_LENGTH}\nbuckets = [16]\n'
                      '[train]\nlearning_rate = 1e-3\nmax_steps = 6\nglobal_batch = 32\n'
                      f'[runtime]\noutput_dir = "{folder / "run"}"\n')
    tpuplex("train", str(config), "--backend", "torch")
    return folder / "run"


def test_eval_on_jax_and_tf_gives_the_trainer_s_metrics(trained):
    expected = json.loads((trained / "results.json").read_text())["metrics"]
    assert expected["emerging.test"]["cut_words"] > 0
    for reader in ("jax", "tf"):
        tpuplex("eval", str(trained), "--backend", reader)
        got = json.loads((trained / "eval" / f"step-00000006-{reader}.json").read_text())["metrics"]
        for split, metrics in expected.items():
            for name, value in metrics.items():
                assert abs(got[split][name] - value) <= METRIC_TOLERANCE, (reader, split, name)


def test_predict_writes_every_word_once_in_input_order(trained, shared_text):
    tags = json.loads((trained / "run.json").read_text())["task_options"]["tags"]
    for split, name in SPLITS.items():
        tpuplex("predict", str(trained), "--backend", "torch", "--split", split)
        written = (trained / "predictions" / "step-00000006-torch" / f"{split}.conll").read_text()
        sentences = [block.splitlines() for block in written.split("\n\n") if block.strip()]
        source = tagged.read_sentences(tagged.data_file("x", str(shared_text / "wnut17" / name)), -1, "tokens",
                                       "tags")
        assert [[line.split("\t")[0] for line in s] for s in sentences] == source.words
        assert [[line.split("\t")[1] for line in s] for s in sentences] == source.tags
        assert {line.split("\t")[2] for s in sentences for line in s} <= set(tags)


TRANSFORMERS_SCRIPT = """
import json, sys
import torch
from transformers import AutoModelForTokenClassification
model = AutoModelForTokenClassification.from_pretrained(sys.argv[1]).eval()
arrays = {name: torch.tensor(values) for name, values in json.loads(sys.argv[2]).items()}
with torch.no_grad():
    print(json.dumps(model(**arrays).logits.tolist()))
"""


def test_the_hf_export_loads_as_a_token_classifier_with_tpuplex_s_logits(trained, tmp_path):
    experiment, state = workflow.restore(run_folder.locate(trained), "torch")
    batcher = experiment.trainer.eval_batchers["emerging.dev"]
    logits, _ = experiment.trainer.predict(state, batcher)
    dev = batcher.data.load()  # every row of the prepared split, in memory
    rows = slice(0, 16)
    mask = (np.arange(MAX_LENGTH)[None, :] < dev.lengths[rows, None]).astype(int)
    arrays = {"input_ids": dev.input_ids[rows].tolist(), "token_type_ids": dev.token_type_ids[rows].tolist(),
              "attention_mask": mask.tolist()}
    tpuplex("export", str(trained), "--format", "hf", "--out", str(tmp_path / "hf"))
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert exported["architectures"] == ["BertForTokenClassification"] and len(exported["id2label"]) == 13
    got = run_python(TRANSFORMERS_SCRIPT, str(tmp_path / "hf"), json.dumps(arrays))
    real = mask.astype(bool)
    np.testing.assert_allclose(got[real], logits[rows][real], atol=LOGIT_TOLERANCE, rtol=0)

"""The workflow across frameworks, each command in a fresh process as a user runs it: a checkpoint trained on one
backend and evaluated by `tpuplex eval` on the others gives the trainer's own metrics; the exported HF folder
loads in plain transformers, and the SavedModel in plain TensorFlow, with tpuplex's logits.

The run: a tiny random BERT reading real MRPC through MiniLM's tokenizer, 12 steps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fresh_process import LOGIT_TOLERANCE, METRIC_TOLERANCE, run_python, tpuplex
from tiny_glue import write_tiny_model_reading

from tpuplex.commands import run_folder, workflow
from tpuplex.tasks.sequence_classification.glue import get_dataset, read_split

pytestmark = pytest.mark.started_first

EXAMPLES = 48  # dev examples whose logits the exported models must reproduce


@pytest.fixture(scope="module")
def setup(tmp_path_factory, minilm_dir, shared_glue) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("workflow")
    model = write_tiny_model_reading(folder / "model", minilm_dir)
    config = folder / "config.toml"
    config.write_text(f'[model]\ncheckpoint = "{model}"\n[data]\ndataset = "mrpc"\n'
                      f'data_dir = "{shared_glue / "MRPC"}"\n'
                      f'max_length = 64\nbuckets = [32, 64]\ncache_dir = "{folder / "cache"}"\n'
                      '[train]\nlearning_rate = 1e-3\nmax_steps = 12\nglobal_batch = 16\n'
                      f'[runtime]\noutput_dir = "{folder / "runs" / "{backend}"}"\n')
    return folder, config


@pytest.fixture(scope="module")
def trained(setup) -> dict[str, Path]:
    """Runs trained on torch and on jax."""
    folder, config = setup
    for backend in ("torch", "jax"):
        tpuplex("train", str(config), "--backend", backend)
    return {backend: folder / "runs" / backend for backend in ("torch", "jax")}


@pytest.mark.parametrize(("writer", "readers"), [("torch", ("torch", "jax", "tf")), ("jax", ("torch",))])
def test_eval_on_any_backend_gives_the_trainer_s_metrics(trained, writer, readers) -> None:
    run = trained[writer]
    expected = json.loads((run / "results.json").read_text())["metrics"]["dev"]
    for reader in readers:
        tpuplex("eval", str(run), "--backend", reader)
        got = json.loads((run / "eval" / f"step-00000012-{reader}.json").read_text())
        assert got["examples"] == {"dev": 408}
        for name, value in expected.items():
            assert abs(got["metrics"]["dev"][name] - value) <= METRIC_TOLERANCE, (writer, reader, name)


@pytest.fixture(scope="module")
def tpuplex_logits(trained) -> tuple[np.ndarray, dict[str, np.ndarray], list[str], list[str]]:
    """The torch run's logits on the first dev examples, their token arrays and their texts."""
    found = run_folder.locate(trained["torch"])
    experiment, state = workflow.restore(found, "torch")
    dev = experiment.trainer.eval_batchers["dev"].data.load()  # every row of the prepared split, in memory
    logits, _ = experiment.trainer.predict(state, experiment.trainer.eval_batchers["dev"])
    mask = (np.arange(dev.max_length)[None, :] < dev.lengths[:, None]).astype(np.int32)
    arrays = {"input_ids": dev.input_ids[:EXAMPLES], "token_type_ids": dev.token_type_ids[:EXAMPLES],
              "attention_mask": mask[:EXAMPLES]}
    text = read_split(get_dataset("mrpc"), "dev", found.config.data.data_dir)
    return logits[:EXAMPLES], arrays, text.text_a[:EXAMPLES], text.text_b[:EXAMPLES]


TRANSFORMERS_SCRIPT = """
import json, sys
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
folder, texts = sys.argv[1], json.loads(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
inputs = tokenizer(texts[0], texts[1], padding=True, truncation=True, max_length=64, return_tensors="pt")
with torch.no_grad():
    print(json.dumps(model(**inputs).logits.tolist()))
"""


def test_the_hf_export_loads_in_transformers_with_tpuplex_s_logits(trained, tpuplex_logits, tmp_path) -> None:
    expected, _, first, second = tpuplex_logits
    tpuplex("export", str(trained["torch"]), "--format", "hf", "--out", str(tmp_path / "hf"))
    got = run_python(TRANSFORMERS_SCRIPT, str(tmp_path / "hf"), json.dumps([first, second]))
    np.testing.assert_allclose(got, expected, atol=LOGIT_TOLERANCE, rtol=0)


SAVED_MODEL_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
arrays = np.load(sys.argv[2])
outputs = serve(**{name: tf.constant(arrays[name]) for name in arrays.files})
assert np.allclose(outputs["probabilities"].numpy().sum(axis=1), 1.0, atol=1e-5)
print(json.dumps(outputs["logits"].numpy().tolist()))
"""


def test_the_saved_model_loads_in_tensorflow_with_tpuplex_s_logits(trained, tpuplex_logits, tmp_path) -> None:
    expected, arrays, _, _ = tpuplex_logits
    tpuplex("export", str(trained["torch"]), "--format", "saved_model", "--out", str(tmp_path / "saved"))
    np.savez(tmp_path / "inputs.npz", **arrays)
    got = run_python(SAVED_MODEL_SCRIPT, str(tmp_path / "saved"), str(tmp_path / "inputs.npz"))
    np.testing.assert_allclose(got, expected, atol=LOGIT_TOLERANCE, rtol=0)

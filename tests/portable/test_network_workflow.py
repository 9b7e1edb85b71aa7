"""The example's TextCNN (examples/custom_model/textcnn.py, a `tpuplex.nn.Network`) through the CLI, each command
in a fresh process as a user runs it: trained on torch, its checkpoint evaluates on jax and tf to the trainer's own
metrics, and its SavedModel gives tpuplex's logits in plain TensorFlow.

The run: real MRPC through MiniLM's tokenizer, 12 steps, dropout off."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from fresh_process import LOGIT_TOLERANCE, METRIC_TOLERANCE, run_python, tpuplex

from tpuplex.commands import run_folder, workflow

pytestmark = pytest.mark.started_first

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_model" / "textcnn.py"
EXAMPLES = 32  # dev examples whose logits the SavedModel must reproduce


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shared_glue) -> Path:
    """The torch run; the model file sits beside the config, as a user's does."""
    folder = tmp_path_factory.mktemp("network")
    shutil.copy(EXAMPLE, folder / "textcnn.py")
    config = folder / "config.toml"
    config.write_text('[model]\narchitecture = "textcnn:TextCNN"\ncheckpoint = "minilm"\ndropout = false\n'
                      f'[data]\ndataset = "mrpc"\ndata_dir = "{shared_glue / "MRPC"}"\nmax_length = 64\n'
                      f'buckets = [32, 64]\ncache_dir = "{folder / "cache"}"\n'
                      '[train]\nlearning_rate = 1e-3\nmax_steps = 12\nglobal_batch = 16\n'
                      f'[runtime]\noutput_dir = "{folder / "run"}"\n')
    tpuplex("train", str(config), "--backend", "torch", cwd=Path(__file__).parent)  # not the config's folder
    return folder / "run"


def test_a_torch_checkpoint_evaluates_alike_on_jax_and_tf(trained) -> None:
    expected = json.loads((trained / "results.json").read_text())["metrics"]["dev"]
    for reader in ("jax", "tf"):
        tpuplex("eval", str(trained), "--backend", reader)
        got = json.loads((trained / "eval" / f"step-00000012-{reader}.json").read_text())
        assert got["examples"] == {"dev": 408}
        for name, value in expected.items():
            assert abs(got["metrics"]["dev"][name] - value) <= METRIC_TOLERANCE, (reader, name)


SAVED_MODEL_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
arrays = np.load(sys.argv[2])
print(json.dumps(serve(**{name: tf.constant(arrays[name]) for name in arrays.files})["logits"].numpy().tolist()))
"""


def test_the_saved_model_gives_tpuplex_s_logits(trained, tmp_path) -> None:
    found = run_folder.locate(trained)
    experiment, state = workflow.restore(found, "torch")
    batcher = experiment.trainer.eval_batchers["dev"]
    dev = batcher.data.load()
    logits, _ = experiment.trainer.predict(state, batcher)
    mask = (np.arange(dev.max_length)[None, :] < dev.lengths[:, None]).astype(np.int32)
    np.savez(tmp_path / "inputs.npz", input_ids=dev.input_ids[:EXAMPLES],
             token_type_ids=dev.token_type_ids[:EXAMPLES], attention_mask=mask[:EXAMPLES])
    tpuplex("export", str(trained), "--format", "saved_model", "--out", str(tmp_path / "saved"))
    got = run_python(SAVED_MODEL_SCRIPT, str(tmp_path / "saved"), str(tmp_path / "inputs.npz"))
    np.testing.assert_allclose(got, logits[:EXAMPLES], atol=LOGIT_TOLERANCE, rtol=0)

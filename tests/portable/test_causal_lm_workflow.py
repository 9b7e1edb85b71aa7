"""A causal LM through the workflow, each command in a fresh process: a tiny GPT-2 trained on torch on the first
20,000 characters of tiny Shakespeare (character vocabulary) generates the same greedy text on jax and tf, with and
without the cache (and the same sampled text on jax), evaluates to the trainer's metrics on jax, and exports an HF
folder whose `generate` (plain transformers) continues the prompt with the same tokens, and a SavedModel (plain
TensorFlow) with the HF folder's logits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fresh_process import LOGIT_TOLERANCE, METRIC_TOLERANCE, run_python, tpuplex

from tpuplex.tasks.causal_lm.data import Characters

pytestmark = pytest.mark.started_first

PROMPT = "ROMEO:"
TOKENS = 40


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shared_text) -> Path:
    folder = tmp_path_factory.mktemp("causal_lm")
    text = (shared_text / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:20000]
    (folder / "input.txt").write_text(text, encoding="utf-8")
    (folder / "model").mkdir()
    (folder / "model" / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "vocab_size": 65, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 4,
        "bos_token_id": None, "eos_token_id": None}))
    (folder / "config.toml").write_text(
        '[task]\nname = "causal_lm"\ntokenizer = "characters"\n[model]\ncheckpoint = "model"\n'
        '[data]\ndataset = "shakespeare"\ntrain_file = "input.txt"\nmax_length = 32\n'
        '[train]\nlearning_rate = 3e-3\nmax_steps = 30\nglobal_batch = 8\nschedule = "cosine"\n'
        '[runtime]\noutput_dir = "run"\n')
    tpuplex("train", str(folder / "config.toml"), "--backend", "torch", cwd=folder)
    return folder / "run"


def generated(run: Path, backend: str, *extra: str, tokens: int = TOKENS) -> str:
    """The `tokens` new characters after the prompt (40: two windows of the 32-token context), as `tpuplex generate`
    prints them: without the prompt, as `Run.generate` returns them."""
    return tpuplex("generate", str(run), "--backend", backend, "--prompt", PROMPT, "--tokens", str(tokens), *extra)


def test_greedy_text_is_the_same_on_torch_and_jax_and_without_the_cache(trained):
    expected = generated(trained, "torch")
    assert len(expected) > TOKENS // 2
    assert generated(trained, "jax") == expected
    assert generated(trained, "torch", "--no-cache") == expected


# tf's generate takes most of a minute here; its greedy tokens equal transformers' in tests/tf/test_decoders.py.
@pytest.mark.long
def test_greedy_text_on_tf_and_sampled_text_on_jax_are_torch_s(trained):
    assert generated(trained, "tf") == generated(trained, "torch")
    sampled = [generated(trained, backend, "--temperature", "0.8", "--top-k", "10", "--seed", "3")
               for backend in ("torch", "jax")]
    assert sampled[0] == sampled[1]


def test_eval_on_jax_gives_the_trainer_s_metrics(trained):
    expected = json.loads((trained / "results.json").read_text())["metrics"]["validation"]
    tpuplex("eval", str(trained), "--backend", "jax")
    got = json.loads((trained / "eval" / "step-00000030-jax.json").read_text())["metrics"]["validation"]
    for name, value in expected.items():  # perplexity is exp(loss): its tolerance scales with it
        assert abs(got[name] - value) <= METRIC_TOLERANCE * max(1.0, abs(value)), name


@pytest.fixture(scope="module")
def hf_export(trained, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("exports") / "hf"
    tpuplex("export", str(trained), "--format", "hf", "--out", str(folder))
    return folder


def prompt_ids(run: Path) -> list[int]:
    vocabulary = Characters(json.loads((run / "run.json").read_text())["task_options"]["characters"])
    return vocabulary.encode(PROMPT, "the prompt").tolist()


def test_the_hf_export_generates_what_tpuplex_does(trained, hf_export):
    within_context = 20  # transformers' generate stops at the model's 32 positions; tpuplex's first window holds 24
    expected = generated(trained, "torch", tokens=within_context)
    ids = prompt_ids(trained)
    script = ("import sys, torch, transformers\n"
              "model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()\n"
              f"out = model.generate(torch.tensor([{ids}]), max_new_tokens={within_context}, do_sample=False)\n"
              f"print(out[0, {len(ids)}:].tolist())\n")
    tokens = run_python(script, str(hf_export)).astype(int)
    vocabulary = Characters(json.loads((trained / "run.json").read_text())["task_options"]["characters"])
    assert vocabulary.decode(tokens) == expected.rstrip("\n")


def test_the_saved_model_gives_the_hf_export_s_logits(trained, hf_export, tmp_path):
    ids = prompt_ids(trained)
    tpuplex("export", str(trained), "--format", "saved_model", "--out", str(tmp_path / "saved"))
    served = run_python("import sys, tensorflow as tf\n"
                        "serve = tf.saved_model.load(sys.argv[1]).signatures['serving_default']\n"
                        f"print(serve(input_ids=tf.constant([{ids}], tf.int32))['logits'].numpy().tolist())\n",
                        str(tmp_path / "saved"))
    expected = run_python("import sys, torch, transformers\n"
                          "model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()\n"
                          f"print(model(torch.tensor([{ids}])).logits.tolist())\n", str(hf_export))
    assert served.shape == (1, len(ids), 65)
    np.testing.assert_allclose(served, expected, atol=LOGIT_TOLERANCE, rtol=0)

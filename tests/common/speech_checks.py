"""The speech tests every backend session runs (tests/<backend>/test_speech.py imports them): a small Conformer
trained with CTC on real recordings (../shared/audio/fsdd, 48 training and 20 dev utterances) through the CLI, 20
dropout-off steps with SpecAugment, against the torch backend: the same losses, and the same transcripts and error
rates from one checkpoint."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from fresh_process import tpuplex
from safetensors.numpy import save_file

import tpuplex as tpuplex_api
from tpuplex.data.audio import characters
from tpuplex.models.conformer import initial_params, read
from tpuplex.tasks.speech_recognition.data import BLANK

CONFORMER = {"model_type": "conformer_ctc", "hidden_size": 32, "num_layers": 2, "num_heads": 4, "ffn_multiplier": 2,
             "conv_kernel": 7, "subsampling_channels": 8, "initializer_range": 0.2}
STEPS = 20
MEL_BINS = 24


def write_manifest(source: Path, out: Path, rows: int) -> Path:
    """The first `rows` utterances of an FSDD manifest, their paths made absolute."""
    with source.open(encoding="utf-8", newline="") as handle:
        read = list(csv.DictReader(handle, delimiter="\t"))[:rows]
    out.write_text("path\ttext\n" + "".join(f"{(source.parent / row['path']).resolve()}\t{row['text']}\n"
                                            for row in read), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def speech_run(shared_audio, tmp_path_factory) -> dict:
    """The config, and the torch backend's run of it (the reference every backend is held to)."""
    root = tmp_path_factory.mktemp("speech")
    fsdd = shared_audio / "fsdd"
    config = root / "config.toml"
    train_file, dev_file = (write_manifest(fsdd / f"{name}.tsv", root / f"{name}.tsv", rows)
                            for name, rows in (("train", 48), ("dev", 20)))
    write_model(root / "conformer", train_file)
    config.write_text(
        f'[task]\nname = "speech_recognition"\nsample_rate = 8000\nmel_bins = {MEL_BINS}\ntime_mask_frames = 10\n'
        f'[model]\ncheckpoint = {json.dumps(str(root / "conformer"))}\ndropout = false\n'
        f'[data]\ndataset = "fsdd"\ntrain_file = {json.dumps(str(train_file))}\n'
        f'eval_files = [{json.dumps(str(dev_file))}]\n'
        f'bucket_count = 2\ncache_dir = {json.dumps(str(root / "cache"))}\n'
        f'[train]\nlearning_rate = 3e-3\nmax_steps = {STEPS}\nglobal_batch = 8\nseed = 3\n'
        '[runtime]\nlog_every = 1\n')
    return {"root": root, "config": config, "torch": train(config, "torch", root / "torch"),
            "initial": train(config, "torch", root / "initial", "train.max_steps=0", "train.epochs=0")}


def write_model(folder: Path, train_file: Path) -> None:
    """The small Conformer with weights drawn from a seed, the blank's logit lowered by 4, so its best paths spell
    something (an untrained CTC model's are all blanks)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFORMER))
    with train_file.open(encoding="utf-8", newline="") as handle:
        vocabulary = characters([row["text"] for row in csv.DictReader(handle, delimiter="\t")])
    params = {name: np.asarray(array) for name, array in
              initial_params(read(CONFORMER), MEL_BINS, len(vocabulary) + 1, seed=0).items()}
    params["head.bias"][BLANK] = -4.0
    save_file(params, str(folder / "model.safetensors"))


def train(config: Path, backend: str, out: Path, *sets: str) -> Path:
    tpuplex("train", str(config), "--backend", backend, "--set", f"runtime.output_dir={json.dumps(str(out))}",
            *(arg for setting in sets for arg in ("--set", setting)))
    return out


def losses(run: Path) -> np.ndarray:
    entries = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return np.array([entry["loss"] for entry in entries if entry["event"] == "train"])


def test_ctc_training_follows_torch_on_real_recordings(backend_name, speech_run) -> None:
    """20 steps: every loss within 1e-4 (relative) of the torch backend's, and the model learns. (62 s on jax with a
    loaded machine: one CLI run, most of it start-up and compiling three frame buckets; the issue's 20 steps.)"""
    run = speech_run["torch"] if backend_name == "torch" else train(speech_run["config"], backend_name,
                                                                    speech_run["root"] / backend_name)
    expected, found = losses(speech_run["torch"]), losses(run)
    assert len(found) == len(expected) == STEPS
    np.testing.assert_allclose(found, expected, rtol=1e-4)
    assert expected[-5:].mean() < 0.8 * expected[:5].mean()
    results = json.loads((run / "results.json").read_text())
    assert results["train"]["tokens"] > 0 and set(results["metrics"]["dev"]) == {"wer", "cer", "loss"}


def test_the_torch_checkpoint_transcribes_alike(backend_name, speech_run) -> None:
    """A torch checkpoint evaluated and predicted on this backend through the CLI, as a user would, against the
    torch backend through the Python API in this process: torch's loss (1e-5), error rates and transcripts, one line
    per dev recording. The checkpoint is the model before training (its drawn weights, the blank held back): twenty
    steps of CTC teach a model to say little ("e" to every recording), where the drawn one says something different
    to each, which is what a comparison needs.

    In the fast tier: it is the one check that a checkpoint transcribes alike on every backend, and its time is two
    CLI start-ups (predict and eval) on 20 real recordings, which no smaller form stands in for."""
    run = speech_run["initial"]
    tpuplex("predict", str(run), "--backend", backend_name, "--split", "dev", "--out", str(run / "predicted-cli"))
    tpuplex("eval", str(run), "--backend", backend_name, "--out", str(run / "eval-cli.json"))
    transcripts = (run / "predicted-cli" / "dev.tsv").read_text().splitlines()
    ours = json.loads((run / "eval-cli.json").read_text())["metrics"]["dev"]
    reference = tpuplex_api.Run.open(run)
    expected = reference.write_predictions("dev", "torch", out=run / "predicted-api")["dev"].read_text().splitlines()
    theirs = reference.evaluate("torch", out=run / "eval-api.json")["metrics"]["dev"]
    assert transcripts == expected
    assert len({line.split("\t")[1] for line in expected[1:]}) >= 15  # nearly all different
    assert expected[0] == "path\ttranscript" and len(expected) == 21
    assert (ours["wer"], ours["cer"]) == (theirs["wer"], theirs["cer"])
    assert abs(ours["loss"] - theirs["loss"]) <= 1e-5 * theirs["loss"]

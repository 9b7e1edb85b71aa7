"""The Python API on every task's example at 2 steps, on torch, over a cut of the real data (tests/common/
shared_subset.py): `tpuplex.train` in this process gives the results `tpuplex train` gives in a fresh one for the
same config and seed (metrics, losses, config hash); then the Run evaluates (the training metrics again), predicts
in memory (or generates, for causal_lm) and exports. And two torch trainings in one process give the losses of
fresh processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fresh_process import tpuplex as tpuplex_cli
from shared_subset import SMALL_BATCH, subset_path

import tpuplex

pytestmark = pytest.mark.started_first

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
CIFAR_TEST = SHARED / "images" / "cifar10" / "test"
FSDD = SHARED / "audio" / "fsdd"
RECORDINGS = [FSDD / "dev" / "george_0000.wav", FSDD / "dev" / "george_0001.wav"]

EXAMPLES = {
    "sequence_classification": "examples/glue/configs/mrpc.toml",
    "token_classification": "examples/ner/wnut17.toml",
    "masked_lm": "examples/mlm/tinyshakespeare.toml",
    "image_classification": "examples/cifar10/resnet20.toml",
    "causal_lm": "examples/shakespeare_char/cpu.toml",
    "speech_recognition": "examples/speech/fsdd.toml",
}
EXPORTS = {"image_classification": "torch_export", "speech_recognition": "torch_export"}
HELD_BY_THE_API = {"image_classification": {"task.images_on_device": True}}
"""The API's ResNet-20 run holds its training images on the device (crops and flips in the step), the CLI's reads
them from the host: the same losses and metrics, the same run."""
"""The format each task's example exports to (the others: an HF folder)."""


@pytest.fixture(scope="module")
def subset_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shared-subset")


def data_overrides(example: str, subset_root: Path) -> dict[str, object]:
    """The example's data fields pointed at their cut copies (a tagging example trains on its whole file, so every
    tag of its cut evaluation files occurs in it)."""
    loaded = tpuplex.Config.load(REPO / example)
    if loaded.task.name == "sequence_classification":
        return {"data.data_dir": str(subset_path(SHARED, SHARED / "glue" / "MRPC", subset_root))}
    whole = loaded.task.name == "token_classification"
    train = loaded.data.train_file if whole else str(subset_path(SHARED, Path(loaded.data.train_file), subset_root))
    return {"data.train_file": train,
            "data.eval_files": [str(subset_path(SHARED, Path(name), subset_root)) for name in loaded.data.eval_files]}


def train_with_the_cli(example: str, output_dir: Path, overrides: dict[str, object]) -> None:
    """`tpuplex train` in a fresh process from the repository root, `overrides` as `--set` arguments."""
    settings = {**overrides, "runtime.output_dir": str(output_dir)}
    tpuplex_cli("train", example, "--backend", "torch",
                *(part for key, value in settings.items() for part in ("--set", f"{key}={json.dumps(value)}")),
                cwd=REPO)


def predict_or_generate(run: tpuplex.Run, task: str) -> None:
    """What each task gives back from inputs in memory (tests/torch/test_speech.py holds the exported speech program
    to `predict`'s transcripts)."""
    if task == "sequence_classification":
        labels = run.predict([("He left the room.", "He went out of the room."), ("It rained.", "Prices rose.")])
        assert len(labels) == 2 and set(labels) <= {"0", "1"}
    elif task == "token_classification":
        tagged = run.predict(["Alice flew to Paris on Monday", ["New", "York"]])
        assert [word for word, _ in tagged[0]] == "Alice flew to Paris on Monday".split()
        assert [word for word, _ in tagged[1]] == ["New", "York"]
        assert all(tag in run.config.task.options["tags"] for sentence in tagged for _, tag in sentence)
        scored = run.predict("Alice flew to Paris on Monday", scores=True)  # one sentence: its words' records
        assert [(word["word"], word["tag"]) for word in scored] == tagged[0]
        assert all(word["score"] == max(word["scores"].values()) for word in scored)
    elif task == "image_classification":
        images = [CIFAR_TEST / "cat" / "0000.jpg", CIFAR_TEST / "ship" / "0000.jpg"]
        classes = run.predict(images)
        assert len(classes) == 2 and set(classes) <= set(run.config.task.options["classes"])
        scored = run.predict(images, scores=True)
        assert [record["label"] for record in scored] == classes and run.predict(images[1]) == classes[1]
        assert all(sum(record["scores"].values()) == pytest.approx(1.0) for record in scored)
    elif task == "speech_recognition":
        transcripts = run.predict([RECORDINGS[0], str(RECORDINGS[1])])
        assert len(transcripts) == 2 and all(isinstance(text, str) for text in transcripts)
    elif task == "causal_lm":
        text = run.generate("ROMEO:", tokens=12)
        assert isinstance(text, str) and len(text) == 12  # a character vocabulary: a token is a character
        assert run.generate(["ROMEO:", "JULIET:"], tokens=4, temperature=0.8, seed=1) == run.generate(
            ["ROMEO:", "JULIET:"], tokens=4, temperature=0.8, seed=1)
        with pytest.raises(tpuplex.TpuplexError, match=r"use Run.generate\(prompts\)"):
            run.predict(["ROMEO:"])
    else:
        with pytest.raises(tpuplex.TpuplexError, match="predicts nothing from inputs: use Run.evaluate"):
            run.predict(["a [MASK] sentence"])


@pytest.fixture(scope="module")
def trained(subset_root, tmp_path_factory):
    """`trained(task)`: (the Run of the task's example trained through `tpuplex.train` in this process, the folder of
    the same run by `tpuplex train` in a fresh one), 2 steps with every step's loss logged, trained once a module:
    the per-task test below and the test of several trainings in one process read the same runs."""
    runs: dict[str, tuple[tpuplex.Run, Path]] = {}

    def train(task: str) -> tuple[tpuplex.Run, Path]:
        if task not in runs:
            folder, example = tmp_path_factory.mktemp(task), EXAMPLES[task]
            overrides = {"train.max_steps": 2, "train.global_batch": SMALL_BATCH, "runtime.log_every": 1,
                         "data.cache_dir": str(folder / "cache"), **data_overrides(example, subset_root)}
            train_with_the_cli(example, folder / "cli", overrides)
            api = {**overrides, "runtime.output_dir": str(folder / "api"), **HELD_BY_THE_API.get(task, {})}
            runs[task] = tpuplex.train(REPO / example, "torch", overrides=api), folder / "cli"
        return runs[task]

    return train


@pytest.mark.parametrize("task", EXAMPLES)
def test_the_api_runs_each_task_s_example_as_the_cli_does(task, shared_glue, shared_text, shared_images,
                                                          shared_audio, trained) -> None:
    run, cli_folder = trained(task)

    from_cli = json.loads((cli_folder / "results.json").read_text())
    assert run.results["config_hash"] == from_cli["config_hash"] and run.results["step"] == 2
    train = from_cli["train"]  # its MFU is omitted when above the peak measured under another load (test_cli)
    assert from_cli["metrics"] and train["model_tflops_per_s"] > 0 and (train["mfu"] is None or 0 < train["mfu"] <= 1)
    assert run.results["losses"] == from_cli["losses"]
    assert run.metrics == from_cli["metrics"]
    evaluated = run.evaluate()["metrics"]
    for split, metrics in run.metrics.items():
        assert evaluated[split] == pytest.approx(metrics, abs=1e-6), split
    predict_or_generate(run, task)
    exported = run.export(EXPORTS.get(task, "hf"))
    assert exported.is_dir() and any(exported.iterdir())


def test_two_torch_trainings_in_one_process_match_fresh_processes(shared_images, shared_text, trained) -> None:
    """ResNet-20 on CIFAR-10 then the character GPT trained in this process, each against its own fresh `tpuplex
    train`: every step's loss and the metrics. The runs are the per-task test's (above, in the same worker: there the
    GPT is this process's fifth training); run alone, this test trains the two, one after the other."""
    for task in ("image_classification", "causal_lm"):
        run, fresh = trained(task)
        expected = tpuplex.Run.open(fresh)
        losses = [row["loss"] for row in run.history()]
        assert len(losses) == 2 and losses == [row["loss"] for row in expected.history()], task
        assert run.metrics == expected.metrics, task

"""The Python API on the numpy backend (docs/python.md): `tpuplex.train` gives the CLI's run, a `Run` reads it back
and evaluates, predicts (in memory and to files) and exports; bad input raises the subclass of TpuplexError with the
CLI's message and leaves the process usable; an interrupt checkpoints and the same call resumes bit for bit. The
same on real backends, every task and a Jupyter kernel: tests/torch/test_api.py, tests/portable/test_api.py."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest
import slow_run
from test_checkpoint import DAMAGES

import tpuplex
from tpuplex.commands import cli
from tpuplex.engine import checkpoint
from tpuplex.testing.numpy_backend import NumpyBackend


def cli_error(argv: list[str], capsys) -> str:
    """The message `tpuplex <argv>` prints for bad input (exit 2)."""
    assert cli.main(argv) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("tpuplex: error: ")
    return line.removeprefix("tpuplex: error: ")


def test_train_from_a_config_gives_the_cli_s_run(write_config, tmp_path, capsys) -> None:
    path = write_config(train__max_steps=10)
    assert cli.main(["train", str(path), "--backend", "numpy", "--set", "train.learning_rate=0.1",
                     "--set", f"runtime.output_dir={json.dumps(str(tmp_path / 'cli'))}"]) == 0
    config = tpuplex.Config.load(path, overrides={"train.learning_rate": 0.1,
                                                  "runtime.output_dir": str(tmp_path / "api")})
    run = tpuplex.train(config, backend="numpy")

    from_cli = json.loads((tmp_path / "cli" / "results.json").read_text())
    assert run.folder == tmp_path / "api" and run.results["config_hash"] == from_cli["config_hash"]
    assert run.metrics == from_cli["metrics"] and run.results["losses"] == from_cli["losses"]
    assert [row["loss"] for row in run.history()] == [row["loss"] for row in tpuplex.Run.open(tmp_path / "cli")
                                                      .history()]
    assert [path.name for path in run.checkpoints] == ["step-00000010"]
    assert tpuplex.Run.open(run.folder).metrics == run.metrics  # read back from results.json
    frame = run.history_frame()
    assert list(frame["step"]) == [row["step"] for row in run.history()] and len(frame) == 5


def test_a_run_evaluates_predicts_and_exports_as_the_cli_does(write_config, tiny_mrpc, tmp_path) -> None:
    run = tpuplex.train(write_config(train__max_steps=10), "numpy")
    assert run.evaluate()["metrics"] == run.metrics  # the backend it trained on, by default
    with (tiny_mrpc / "dev.tsv").open(encoding="utf-8") as file:
        rows = list(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    pairs = [(row[3], row[4]) for row in rows]
    written = run.write_predictions("dev", out=tmp_path / "predictions")["dev"]
    with written.open(encoding="utf-8") as file:
        from_file = [line.split("\t")[1] for line in file.read().splitlines()[1:]]
    predicted = run.predict(pairs)
    assert predicted == from_file and len(predicted) == 37 and set(predicted) <= {"0", "1"}  # MRPC's labels
    exported = run.export("hf", out=tmp_path / "hf")
    assert (exported / "config.json").is_file() and exported == tmp_path / "hf"


def test_predict_gives_scores_on_request_and_one_prediction_for_one_input(write_config, tiny_mrpc, tmp_path) -> None:
    """`scores=True`: a record per input, HF's pipeline's label and score with every label's probability (the
    softmax of the logits); a text given alone (a string) is one input and gives one prediction."""
    from custom_files import FIRST, custom_fields, mrpc_splits, write_splits

    run = tpuplex.train(write_config(train__max_steps=2), "numpy")
    pairs = [("The cat sat.", "A cat was sitting."), ("It rained.", "Prices rose."), ("Yes.", "No.")]
    records = run.predict(pairs, scores=True)
    assert [record["label"] for record in records] == run.predict(pairs)
    for record in records:
        assert set(record) == {"label", "score", "scores"} and set(record["scores"]) == {"0", "1"}
        assert record["score"] == max(record["scores"].values()) == record["scores"][record["label"]]
        assert sum(record["scores"].values()) == pytest.approx(1.0)
    assert len({round(record["score"], 9) for record in records}) == 3  # each input its own probabilities
    with pytest.raises(tpuplex.DataError, match=r"Run.predict\(scores='yes'\): give True"):
        run.predict(pairs, scores="yes")

    paths = write_splits(tmp_path / "single", "csv", mrpc_splits(tiny_mrpc))  # one text column: MRPC's first
    fields = {**custom_fields(paths), "task__text_columns": [FIRST], "runtime__output_dir": str(tmp_path / "one")}
    single = tpuplex.train(write_config(train__max_steps=2, **fields), "numpy")
    texts = ["Amrozi accused his brother.", "Shares rose."]
    assert single.predict(texts[0]) == single.predict(texts)[0] and isinstance(single.predict(texts[0]), str)
    assert single.predict(texts[1], scores=True) == single.predict(texts, scores=True)[1]


@pytest.mark.parametrize("inputs", ["one string", ["a single text, not a pair"], [("a", "b", "c")], []])
def test_inputs_the_task_cannot_predict_raise_a_data_error(write_config, inputs) -> None:
    run = tpuplex.train(write_config(train__max_steps=2), "numpy")
    with pytest.raises(tpuplex.DataError, match="pairs of texts"):
        run.predict(inputs)


def test_bad_input_raises_the_subclass_with_the_cli_s_message(write_config, tiny_mrpc, tmp_path, capsys) -> None:
    bad_field = write_config(train__learning_rate=-1)
    with pytest.raises(tpuplex.ConfigError) as raised:
        tpuplex.train(bad_field, "numpy")
    assert str(raised.value) == cli_error(["train", str(bad_field), "--backend", "numpy"], capsys)

    missing = write_config(data__data_dir=str(tmp_path / "no-such-folder"))
    with pytest.raises(tpuplex.DataError) as raised:
        tpuplex.train(missing, "numpy")
    assert str(raised.value) == cli_error(["train", str(missing), "--backend", "numpy"], capsys)
    assert not (tmp_path / "run").exists()  # nothing half-written

    run = tpuplex.train(write_config(train__max_steps=4), "numpy")  # the process is still usable
    step = run.checkpoints[-1]
    DAMAGES["truncated model.safetensors"][0](step)
    with pytest.raises(tpuplex.CheckpointError) as raised:
        tpuplex.Run.open(step).evaluate()
    assert str(raised.value) == cli_error(["eval", str(step), "--backend", "numpy"], capsys)
    assert isinstance(raised.value, tpuplex.TpuplexError)


def test_an_interrupt_checkpoints_and_the_same_call_resumes_bit_for_bit(write_config, tmp_path, monkeypatch) -> None:
    """SIGINT (a notebook's interrupt) during step 6: that step finishes and is checkpointed, the call raises
    Preempted, a KeyboardInterrupt; the same call then finishes the run as one uninterrupted run ends."""
    config = tpuplex.Config.load(write_config(train__max_steps=12, runtime__checkpoint_every=4))
    step, calls = NumpyBackend.train_step, []

    def interrupted_step(self, state, batch, learning_rate):
        calls.append(1)
        if len(calls) == 6:
            os.kill(os.getpid(), signal.SIGINT)  # delivered here, in the main thread, before the step returns
        return step(self, state, batch, learning_rate)

    monkeypatch.setattr(NumpyBackend, "train_step", interrupted_step)
    with pytest.raises(KeyboardInterrupt) as raised:
        tpuplex.train(config, "numpy")
    assert isinstance(raised.value, tpuplex.Preempted) and raised.value.step == 6
    assert str(raised.value).endswith("call tpuplex.train again with the same config to resume from it")
    assert checkpoint.latest(tmp_path / "run" / "checkpoints").name == "step-00000006"

    resumed = tpuplex.train(config, "numpy")
    assert resumed.results["resumed_from"].endswith("step-00000006") and resumed.results["step"] == 12
    whole = tpuplex.train(config.override({"runtime.output_dir": str(tmp_path / "whole")}), "numpy")
    assert resumed.metrics == whole.metrics
    slow_run.assert_same_final_state(resumed.folder, whole.folder)


def test_config_from_a_dict_and_overrides(tiny_model, tiny_mrpc, tmp_path) -> None:
    raw = {"model": {"checkpoint": str(tiny_model)},
           "data": {"dataset": "mrpc", "max_length": 32, "cache_dir": str(tmp_path / "cache")},
           "train": {"global_batch": 8, "max_steps": 3},
           "runtime": {"output_dir": str(tmp_path / "run")}}
    config = tpuplex.Config.from_dict(raw)
    assert config.override(["train.seed=3"]).train.seed == 3 == config.override({"train.seed": 3}).train.seed
    with pytest.raises(tpuplex.ConfigError, match="unknown config field train.sed"):
        config.override({"train.sed": 3})
    run = tpuplex.train(config, "numpy", data_dir=tiny_mrpc)
    assert run.results["step"] == 3 and run.results["config"]["data"]["data_dir"] == str(tiny_mrpc)
    assert isinstance(tpuplex.devices().report(), str)
    assert np.isfinite(run.results["losses"]["last"])
    assert Path(run.results["output_dir"]) == run.folder


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: tpuplex.train(123, "numpy"), tpuplex.ConfigError, "tpuplex.train takes a Config or the path of a TOML "
                                                                "config, not int 123"),
    (lambda: tpuplex.train(None, "numpy"), tpuplex.ConfigError, "not NoneType None"),
    (lambda: tpuplex.Run.open(42), tpuplex.CheckpointError, "Run.open takes the path of a run folder, not int 42"),
    (lambda: tpuplex.Config.from_dict([1, 2]), tpuplex.ConfigError, "Config.from_dict takes the config's sections "
                                                                     "as a dict"),
])
def test_an_argument_of_the_wrong_type_is_a_tpuplex_error(call, error, message) -> None:
    with pytest.raises(error, match=re.escape(message)):
        call()


def test_a_generate_option_of_the_wrong_type_names_it_and_the_type_it_takes(write_config) -> None:
    """Checked before the run is read, as every task's `Run.generate` (a T5 run's too) takes them."""
    run = tpuplex.train(write_config(train__max_steps=1), "numpy")
    for option, flag, value, takes in (("temperature", "--temperature", "hot", "a number (float)"),
                                       ("top_k", "--top-k", 2.5, "a whole number (int)"),
                                       ("beams", "--beams", "4", "a whole number (int)"),
                                       ("tokens", "--tokens", None, "a whole number (int)"),
                                       ("seed", "--seed", True, "a whole number (int)"),
                                       ("length_penalty", "--length-penalty", [1], "a number (float)")):
        with pytest.raises(tpuplex.TpuplexError, match=re.escape(
                f"{option} = {value!r} is a {type(value).__name__}: {option} ({flag}) takes {takes}")):
            run.generate("ROMEO:", **{option: value})


def test_a_run_refuses_prompts_that_are_not_text_and_events_it_never_logs(write_config) -> None:
    run = tpuplex.train(write_config(train__max_steps=2), "numpy")
    for prompts in (123, ["ROMEO:", 5]):
        with pytest.raises(tpuplex.DataError, match="Run.generate takes a prompt"):
            run.generate(prompts)
    with pytest.raises(tpuplex.TpuplexError, match="the log has no such event; the events are checkpoint, epoch, "
                                                   "error, eval, preempted, start, train"):
        run.history(event="nope")
    assert run.history("preempted") == [] and len(run.history("start")) == 1

"""Every bad input is one `tpuplex: error:` line, exit 2, no traceback and nothing left behind: a matrix over the
config, GLUE data, the model folder, its tokenizer, the output location and resuming (numpy backend, through the
CLI). Your own data's file and field defects have their own matrix in test_custom_data.py."""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tpuplex.commands import cli
from tpuplex.engine import checkpoint


class Case:
    """A bad input: `make(tmp_path, env)` breaks one thing and returns the extra CLI arguments."""

    def __init__(self, make: Callable[[Path, dict], list[str]], fragment: str):
        self.make, self.fragment = make, fragment


def setting(*overrides: str) -> Callable[[Path, dict], list[str]]:
    return lambda tmp_path, env: [arg for override in overrides for arg in ("--set", override)]


def config_text(text: str | bytes) -> Callable[[Path, dict], list[str]]:
    def make(tmp_path: Path, env: dict) -> list[str]:
        path = env["config"]
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return []
    return make


def in_model(change: Callable[[Path], None]) -> Callable[[Path, dict], list[str]]:
    """A copy of the tiny model with `change` applied, as model.checkpoint."""
    def make(tmp_path: Path, env: dict) -> list[str]:
        model = tmp_path / "model"
        shutil.copytree(env["model"], model)
        change(model)
        return ["--set", f"model.checkpoint={json.dumps(str(model))}"]
    return make


def hf_config(**changes) -> Callable[[Path], None]:
    def change(model: Path) -> None:
        config = json.loads((model / "config.json").read_text())
        for key, value in changes.items():
            if value is None:
                config.pop(key)
            else:
                config[key] = value
        (model / "config.json").write_text(json.dumps(config))
    return change


def write_file(name: str, content: str | bytes) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return change


def remove(*names: str) -> Callable[[Path], None]:
    return lambda folder: [(folder / name).unlink() for name in names]


def weights(change: Callable[[dict], dict]) -> Callable[[Path], None]:
    def apply(model: Path) -> None:
        save_file(change(load_file(model / "model.safetensors")), model / "model.safetensors")
    return apply


def in_data(change: Callable[[Path], None]) -> Callable[[Path, dict], list[str]]:
    """A copy of the tiny MRPC folder with `change` applied, as data.data_dir."""
    def make(tmp_path: Path, env: dict) -> list[str]:
        data = tmp_path / "MRPC"
        shutil.copytree(env["mrpc"], data)
        change(data)
        return ["--data-dir", str(data)]
    return make


def train_lines(change: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    def apply(data: Path) -> None:
        lines = (data / "train.tsv").read_text(encoding="utf-8").splitlines()
        (data / "train.tsv").write_text("\n".join(change(lines)) + "\n", encoding="utf-8")
    return apply


def output_at(make_location: Callable[[Path], Path]) -> Callable[[Path, dict], list[str]]:
    def make(tmp_path: Path, env: dict) -> list[str]:
        return ["--set", f"runtime.output_dir={json.dumps(str(make_location(tmp_path)))}"]
    return make


def a_file(path: Path) -> Path:
    path.write_text("a file")
    return path


def under_a_file(path: Path) -> Path:
    return a_file(path) / "run"


def after_a_run(damage: Callable[[Path], None], *overrides: str) -> Callable[[Path, dict], list[str]]:
    """A finished two-step run in <tmp>/run, then `damage` on its checkpoints folder; the case resumes it."""
    def make(tmp_path: Path, env: dict) -> list[str]:
        assert cli.main(["train", str(env["config"]), "--backend", "numpy", "--set", "train.max_steps=2"]) == 0
        damage(tmp_path / "run" / "checkpoints")
        (tmp_path / "run" / "results.json").unlink()
        return ["--set", "train.max_steps=2", *(arg for override in overrides for arg in ("--set", override))]
    return make


def every_checkpoint(change: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda root: [change(path) for path in checkpoint.checkpoints(root)]


def pickled_code(folder: Path) -> None:
    class Payload:
        def __reduce__(self):
            return (print, ("ran",))

    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"payload": Payload()}))


CONFIG = {
    "not TOML": Case(config_text("[train\n"), "is not valid TOML"),
    "Latin-1 text": Case(config_text("# caf\xe9\n[train]\nseed = 1\n".encode("latin-1")), "is not UTF-8"),
    "UTF-16 text": Case(config_text("[train]\nseed = 1\n".encode("utf-16")), "is not UTF-8"),
    "unknown section": Case(config_text("[trainer]\nseed = 1\n"), "unknown config section [trainer]"),
    "unknown field": Case(setting("train.sed=1"), "train.sed"),
    "section not a table": Case(config_text("train = 3\n"), "train"),
    "string for an integer": Case(setting('train.seed="one"'), "train.seed"),
    "float for an integer": Case(setting("train.global_batch=8.5"), "train.global_batch"),
    "bool for an integer": Case(setting("train.epochs=true"), "train.epochs"),
    "string for a float": Case(setting('train.learning_rate="fast"'), "train.learning_rate"),
    "number for a string": Case(setting("model.checkpoint=3"), "model.checkpoint"),
    "number for a bool": Case(setting("model.dropout=1"), "model.dropout"),
    "number for a list": Case(setting("data.buckets=16"), "data.buckets"),
    "strings in a number list": Case(setting('data.buckets=["16"]'), "data.buckets"),
    "negative learning rate": Case(setting("train.learning_rate=-1e-3"), "train.learning_rate"),
    "zero learning rate": Case(setting("train.learning_rate=0.0"), "train.learning_rate"),
    "zero global batch": Case(setting("train.global_batch=0"), "train.global_batch"),
    "zero grad accumulation": Case(setting("train.grad_accum=0"), "train.grad_accum"),
    "grad_accum not dividing": Case(setting("train.grad_accum=3"), "train.grad_accum"),
    "negative epochs": Case(setting("train.epochs=-1"), "train.epochs"),
    "warmup ratio 1.5": Case(setting("train.warmup_ratio=1.5"), "train.warmup_ratio"),
    "beta1 = 1": Case(setting("train.adam_beta1=1.0"), "train.adam_beta1"),
    "negative weight decay": Case(setting("train.weight_decay=-0.1"), "train.weight_decay"),
    "negative seed": Case(setting("train.seed=-1"), "train.seed"),
    "seed over 32 bits": Case(setting("train.seed=4294967296"), "train.seed"),
    "zero max_length": Case(setting("data.max_length=0"), "data.max_length"),
    "max_length over the positions": Case(setting("data.max_length=65"), "data.max_length = 65"),
    "negative max_steps": Case(setting("train.max_steps=-5"), "train.max_steps"),
    "negative clip_norm": Case(setting("train.clip_norm=-1.0"), "train.clip_norm"),
    "negative adam_epsilon": Case(setting("train.adam_epsilon=-1e-8"), "train.adam_epsilon"),
    "negative eval_every": Case(setting("runtime.eval_every=-1"), "runtime.eval_every"),
    "negative cpu_devices": Case(setting("runtime.cpu_devices=-2"), "runtime.cpu_devices"),
    "infinite peak_tflops": Case(setting("runtime.peak_tflops=inf"), "runtime.peak_tflops = inf is not allowed"),
    "NaN learning rate": Case(setting("train.learning_rate=nan"), "train.learning_rate = nan is not allowed"),
    "mesh not fitting the devices": Case(setting("runtime.mesh={data = 3}"), "does not fit the 1 device(s)"),
    "config file missing": Case(lambda tmp_path, env: [env["config"].unlink()] and [], "does not exist"),
    "config file a folder": Case(lambda tmp_path, env: [env["config"].unlink(), env["config"].mkdir()] and [],
                                 "config.toml is a folder: pass the path of a TOML config"),
    "extends a file that is not TOML": Case(lambda tmp_path, env: (
        (tmp_path / "base.toml").write_text("[model\n"),
        env["config"].write_text('extends = "base.toml"\n'))[:0] or [], "base.toml"),
    "unknown device": Case(setting('runtime.device="xpu"'), "runtime.device"),
    "unknown torch_mode": Case(setting('runtime.torch_mode="fast"'), "runtime.torch_mode"),
    "unknown on_preempt": Case(setting('runtime.on_preempt="maybe"'), "runtime.on_preempt"),
    "unknown optimizer": Case(setting('train.optimizer="lamb"'), "train.optimizer"),
    "unknown schedule": Case(setting('train.schedule="step"'), "train.schedule"),
    "momentum 1.5": Case(setting("train.momentum=1.5"), "train.momentum"),
    "unknown batch_norm": Case(setting('model.batch_norm="sync"'), "model.batch_norm"),
    "zero keep_checkpoints": Case(setting("runtime.keep_checkpoints=0"), "runtime.keep_checkpoints"),
    "zero log_every": Case(setting("runtime.log_every=0"), "runtime.log_every"),
    "profile steps reversed": Case(setting("runtime.profile_steps=[3, 1]"), "runtime.profile_steps"),
    "profile steps one number": Case(setting("runtime.profile_steps=[3]"), "runtime.profile_steps"),
    "unknown GLUE dataset": Case(setting('data.dataset="mrcp"'), "unknown GLUE dataset 'mrcp'"),
    "architecture not an import path": Case(setting('model.architecture="textcnn"'), "model.architecture"),
    "--set without =": Case(lambda tmp_path, env: ["--set", "train.seed"], "--set"),
    "--set without a section": Case(lambda tmp_path, env: ["--set", "seed=1"], "seed"),
    "--set value not TOML": Case(lambda tmp_path, env: ["--set", "train.seed=[1"], "train.seed"),
    "extends a missing file": Case(config_text('extends = "nope.toml"\n'), "nope.toml"),
    "extends itself": Case(config_text('extends = "config.toml"\n'), "extends"),
    "extends a number": Case(config_text("extends = 3\n"), "extends = 3"),
    "batch not divisible by eval rows": Case(setting("train.global_batch=7", "runtime.cpu_devices=2"),
                                             "does not divide by the 2 replicas"),
}

MODEL = {
    "checkpoint folder missing": Case(setting('model.checkpoint="/nonexistent/model"'), "/nonexistent/model"),
    "checkpoint is a file": Case(lambda tmp_path, env: [
        "--set", f"model.checkpoint={json.dumps(str(a_file(tmp_path / 'm')))}"], "is not a directory"),
    "no config.json": Case(in_model(remove("config.json")), "config.json"),
    "config.json not JSON": Case(in_model(write_file("config.json", "{not json")), "config.json"),
    "config.json a list": Case(in_model(write_file("config.json", "[1, 2]")), "config.json"),
    "config.json Latin-1": Case(in_model(write_file("config.json", '{"model_type": "b\xe9rt"}'.encode("latin-1"))),
                                "config.json"),
    "no model_type": Case(in_model(hf_config(model_type=None)), "model_type"),
    "unknown model_type": Case(in_model(hf_config(model_type="bart")), "'bart'"),
    "an image model for a text task": Case(in_model(hf_config(model_type="resnet", hidden_act="relu")),
                                           "is a resnet model, which the sequence_classification task cannot train"),
    "unknown ResNet layer": Case(in_model(hf_config(model_type="resnet", hidden_act="relu", layer_type="wide")),
                                 "is not a ResNet layer"),
    "ViT image not whole patches": Case(in_model(hf_config(model_type="vit", image_size=30, patch_size=16)),
                                        "is not a whole number of"),
    "no hidden_size": Case(in_model(hf_config(hidden_size=None)), "hidden_size"),
    "no max_position_embeddings": Case(in_model(hf_config(max_position_embeddings=None)), "max_position_embeddings"),
    "no vocab_size": Case(in_model(hf_config(vocab_size=None)), "vocab_size"),
    "heads not dividing hidden": Case(in_model(hf_config(num_attention_heads=5)), "5 attention heads"),
    "hidden_size a string": Case(in_model(hf_config(hidden_size="32")), "hidden_size"),
    "negative layers": Case(in_model(hf_config(num_hidden_layers=-1)), "num_hidden_layers"),
    "dropout over 1": Case(in_model(hf_config(hidden_dropout_prob=1.5)), "hidden_dropout_prob = 1.5 in"),
    "negative dropout": Case(in_model(hf_config(attention_probs_dropout_prob=-0.5)), "which must be in [0, 1]"),
    "unknown activation": Case(in_model(hf_config(hidden_act="swish2")), "hidden_act"),
    "weights empty": Case(in_model(write_file("model.safetensors", b"")), "model.safetensors"),
    "weights truncated": Case(in_model(lambda m: (m / "model.safetensors").write_bytes(
        (m / "model.safetensors").read_bytes()[:1000])), "model.safetensors"),
    "weights garbage": Case(in_model(write_file("model.safetensors", b"\x00" * 64)), "model.safetensors"),
    "weights a JSON file": Case(in_model(write_file("model.safetensors", "{}")), "model.safetensors"),
    "pytorch_model.bin a plain pickle": Case(in_model(pickled_code), "cannot read the weights"),
    "pytorch_model.bin garbage": Case(in_model(lambda m: (remove("model.safetensors")(m),
                                                          write_file("pytorch_model.bin", b"garbage")(m))),
                                      "pytorch_model.bin"),
    "a weight missing": Case(in_model(weights(lambda w: {k: v for k, v in w.items()
                                                         if k != "embeddings.word_embeddings.weight"})),
                             "bert.embeddings.word_embeddings.weight"),
    "a weight of the wrong shape": Case(in_model(weights(lambda w: {
        **w, "embeddings.word_embeddings.weight": np.zeros((128, 31), np.float32)})),
        "bert.embeddings.word_embeddings.weight"),
    "no tokenizer": Case(in_model(remove("tokenizer.json", "vocab.txt")), "tokenizer"),
    "tokenizer.json not JSON": Case(in_model(lambda m: (remove("vocab.txt")(m),
                                                        write_file("tokenizer.json", "{not json")(m))),
                                    "tokenizer.json"),
    "tokenizer.json of another kind": Case(in_model(lambda m: (remove("vocab.txt")(m),
                                                               write_file("tokenizer.json", '{"a": 1}')(m))),
                                           "tokenizer.json"),
    "tokenizer larger than the embeddings": Case(in_model(hf_config(vocab_size=16)), "word embeddings"),
    "empty vocab.txt": Case(in_model(lambda m: (remove("tokenizer.json")(m), write_file("vocab.txt", "")(m))),
                            "vocab.txt"),
    "only a slow BPE tokenizer": Case(in_model(lambda m: (remove("tokenizer.json", "vocab.txt")(m),
                                                          write_file("vocab.json", "{}")(m),
                                                          write_file("merges.txt", "")(m))), "tokenizer.json"),
}

DATA = {
    "data folder missing": Case(lambda tmp_path, env: ["--data-dir", str(tmp_path / "nope")], "does not exist"),
    "data folder is a file": Case(lambda tmp_path, env: ["--data-dir", str(a_file(tmp_path / "d"))], "MRPC"),
    "no train.tsv": Case(in_data(remove("train.tsv")), "train.tsv"),
    "no dev.tsv": Case(in_data(remove("dev.tsv")), "dev.tsv"),
    "empty train.tsv": Case(in_data(write_file("train.tsv", "")), "train.tsv"),
    "header only": Case(in_data(train_lines(lambda lines: lines[:1])), "train.tsv"),
    "missing column": Case(in_data(train_lines(lambda lines: [lines[0].replace("Quality", "Label"), *lines[1:]])),
                           "Quality"),
    "label 2": Case(in_data(train_lines(lambda lines: [lines[0], "2" + lines[1][1:], *lines[2:]])), "label"),
    "label not a number": Case(in_data(train_lines(lambda lines: [lines[0], "x" + lines[1][1:], *lines[2:]])),
                               "label"),
    "row with too few fields": Case(in_data(train_lines(lambda lines: [lines[0], "1\t2", *lines[1:]])),
                                    "train.tsv"),
    "Latin-1 bytes": Case(in_data(write_file("train.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                                                          "1\t1\t2\tcaf\xe9\tbar\n".encode("latin-1"))),
                          "not UTF-8"),
    "UTF-16 file": Case(in_data(lambda d: (d / "train.tsv").write_bytes(
        (d / "train.tsv").read_text(encoding="utf-8").encode("utf-16"))), "train.tsv"),
    "invalid bytes": Case(in_data(lambda d: (d / "train.tsv").write_bytes(
        (d / "train.tsv").read_bytes() + b"1\t1\t2\t\xff\xfe\tx\n")), "not UTF-8"),
    "dev.tsv empty": Case(in_data(write_file("dev.tsv", "")), "dev.tsv"),
}

OUTPUT = {
    "output_dir is a file": Case(output_at(lambda tmp: a_file(tmp / "out")), "runtime.output_dir"),
    "output_dir under a file": Case(output_at(lambda tmp: under_a_file(tmp / "out")), "runtime.output_dir"),
    "output_dir with an unknown placeholder": Case(setting('runtime.output_dir="runs/{model}"'), "{model}"),
    "cache_dir is a file": Case(lambda tmp_path, env: [
        "--set", f"data.cache_dir={json.dumps(str(a_file(tmp_path / 'cachefile')))}"], "data.cache_dir"),
}

RESUME = {
    "another configuration": Case(after_a_run(lambda root: None, "train.learning_rate=0.01"),
                                  "another configuration"),
    "every checkpoint without a manifest": Case(after_a_run(every_checkpoint(remove("manifest.json"))),
                                                "no usable checkpoint"),
    "every checkpoint truncated": Case(after_a_run(every_checkpoint(lambda p: (p / "model.safetensors").write_bytes(
        b"x"))), "no usable checkpoint"),
    "every trainer.json garbage": Case(after_a_run(every_checkpoint(write_file("trainer.json", "garbage"))),
                                       "no usable checkpoint"),
    "every optimizer state empty": Case(after_a_run(every_checkpoint(write_file("optimizer.safetensors", b""))),
                                        "no usable checkpoint"),
    "checkpoints folder is a file": Case(after_a_run(lambda root: (shutil.rmtree(root), a_file(root))),
                                         "checkpoints"),
}

MATRIX = {f"{group}: {name}": case for group, cases in
          (("config", CONFIG), ("model", MODEL), ("data", DATA), ("output", OUTPUT), ("resume", RESUME))
          for name, case in cases.items()}


def test_the_matrix_has_at_least_100_cases() -> None:
    assert len(MATRIX) >= 100, len(MATRIX)


@pytest.mark.parametrize("name", list(MATRIX))
def test_bad_input_is_one_line_exit_2_and_nothing_left_behind(name, write_config, tiny_model, tiny_mrpc, tmp_path,
                                                             capsys) -> None:
    case = MATRIX[name]
    config = write_config()
    extra = case.make(tmp_path, {"config": config, "model": tiny_model, "mrpc": tiny_mrpc})
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    capsys.readouterr()
    code = cli.main(["train", str(config), "--backend", "numpy", *extra])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("tpuplex:")]
    assert code == 2 and len(errors) == 1 and errors[0].startswith("tpuplex: error: "), err
    assert "Traceback" not in err and "unexpected" not in errors[0], err
    assert case.fragment in errors[0], errors[0]
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert [p for p in after if p not in before and not p.startswith("cache")] == [], "left behind"


@pytest.mark.parametrize(("option", "message"), [
    (["--temperature", "nan"], "use a finite temperature >= 0"),
    (["--temperature", "inf"], "use a finite temperature >= 0"),
    (["--seed", "-1"], "--seed -1: use a seed in"),
    (["--prompt-file", "."], "--prompt-file . is a folder: give a UTF-8 text file"),
])
def test_a_bad_sampling_option_is_one_line(tmp_path, capsys, option, message) -> None:
    status = cli.main(["generate", str(tmp_path), "--backend", "numpy", "--prompt", "ROMEO:", *option])
    error = capsys.readouterr().err
    assert status == 2 and message in error and error.count("\n") == 1


@pytest.mark.parametrize("length", ["0", "-5", "1"])
def test_prepare_refuses_rows_too_short_to_predict(tmp_path, capsys, tiny_model, length) -> None:
    (tmp_path / "corpus.txt").write_text("To be, or not to be, that is the question.\n")
    out = tmp_path / "prepared"
    status = cli.main(["prepare", str(tmp_path / "corpus.txt"), "--out", str(out), "--task", "causal_lm",
                       "--tokenizer", str(tiny_model), "--max-length", length])
    assert status == 2 and f"--max-length {length}: use rows of at least 2 tokens" in capsys.readouterr().err
    assert not out.exists()


def test_a_negative_gpt2_inner_size_is_one_line() -> None:
    from tpuplex import models
    from tpuplex.errors import TpuplexError

    config = {"model_type": "gpt2", "vocab_size": 50, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 4,
              "n_inner": -4}
    with pytest.raises(TpuplexError, match="n_inner = -4 in config.json must be positive"):
        models.architecture_of(config)


def test_prepare_refuses_a_cache_dir_that_is_a_file(write_config, tmp_path, capsys) -> None:
    (tmp_path / "cachefile").write_text("mine")
    cache = f"data.cache_dir={json.dumps(str(tmp_path / 'cachefile'))}"
    status = cli.main(["prepare", str(write_config()), "--set", cache])
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1, error
    assert f"data.cache_dir = '{tmp_path / 'cachefile'}' is a file: choose a folder path" in error
    assert (tmp_path / "cachefile").read_text() == "mine"

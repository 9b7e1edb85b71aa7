"""Several trainings in one Python process (a notebook's kernel): torch, then jax, then torch again, each giving the
losses and metrics of `tpuplex train` in a fresh process; and what a framework fixes once per process (JAX's CPU
device count) refused in one line, the process still usable. The run: a tiny random BERT reading real MRPC through
MiniLM's tokenizer, 6 steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fresh_process import tpuplex as tpuplex_cli
from tiny_glue import write_tiny_model_reading

import tpuplex


@pytest.fixture(scope="module")
def config(tmp_path_factory, minilm_dir, shared_glue) -> tpuplex.Config:
    folder = tmp_path_factory.mktemp("api")
    model = write_tiny_model_reading(folder / "model", minilm_dir)
    return tpuplex.Config.from_dict({
        "model": {"checkpoint": str(model)},
        "data": {"dataset": "mrpc", "data_dir": str(shared_glue / "MRPC"), "max_length": 64, "buckets": [32, 64],
                 "cache_dir": str(folder / "cache")},
        "train": {"learning_rate": 1e-3, "max_steps": 6, "global_batch": 16},
        "runtime": {"output_dir": str(folder / "runs" / "{backend}"), "log_every": 1}})


def fresh(config: tpuplex.Config, backend: str, folder: Path) -> tpuplex.Run:
    """`tpuplex train` of `config` on `backend` in a fresh process, into `folder`."""
    folder.mkdir(exist_ok=True)
    path = folder / f"{backend}.toml"
    lines = []
    for section, fields in config.override({"runtime.output_dir": str(folder / backend)}).to_dict().items():
        lines.append(f"[{section}]")
        lines += [f"{name} = {json.dumps(value)}" for name, value in fields.items() if value is not None]
    path.write_text("\n".join(lines) + "\n")
    tpuplex_cli("train", str(path), "--backend", backend)
    return tpuplex.Run.open(folder / backend)


def test_torch_then_jax_then_torch_in_one_process_match_fresh_processes(config, tmp_path) -> None:
    """In the fast tier although it takes about 75 s under two workers: the two fresh processes and the three runs in
    this one are the claim itself, on a tiny model."""
    expected = {backend: fresh(config, backend, tmp_path / "fresh") for backend in ("torch", "jax")}
    for index, backend in enumerate(("torch", "jax", "torch")):
        run = tpuplex.train(config.override({"runtime.output_dir": str(tmp_path / f"{index}-{backend}")}), backend)
        assert [row["loss"] for row in run.history()] == [row["loss"] for row in expected[backend].history()], index
        assert run.metrics == expected[backend].metrics, index


def test_jax_s_cpu_devices_fixed_once_a_process_is_refused_in_one_line(config, tmp_path) -> None:
    tpuplex.train(config.override({"runtime.output_dir": str(tmp_path / "first")}), "jax")  # JAX starts: 1 CPU device
    with pytest.raises(tpuplex.TpuplexError, match=r"runtime.cpu_devices = 2 but JAX already runs with 1 CPU"):
        tpuplex.train(config.override({"runtime.output_dir": str(tmp_path / "second"), "runtime.cpu_devices": 2}),
                      "jax")
    assert not (tmp_path / "second").exists()
    again = tpuplex.train(config.override({"runtime.output_dir": str(tmp_path / "third")}), "jax")
    assert again.results["step"] == 6

"""`train.fp8`: the networks' matrix products in float8 (torchao's float8 training, emulated on the CPU: the same
numbers a GPU with float8 computes, without its speed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from llama_runs import train_losses, write_llama_run

import tpuplex


def test_fp8_trains_the_llama_as_bf16_does(shared_text, tmp_path, monkeypatch) -> None:
    """The tiny Llama's 12 steps of Shakespeare with bf16 and with bf16 + fp8: the first step's loss differs (its
    products ran in float8), every step's loss within 0.5% of bf16's; without torchao, one line."""
    config = write_llama_run(tmp_path, shared_text, steps=12, checkpoint_every=0)
    monkeypatch.chdir(tmp_path)
    losses = {}
    for name, fp8 in (("bf16", False), ("fp8", True)):
        tpuplex.train(config, "torch", overrides={"train.bf16": True, "train.fp8": fp8,
                                                  "runtime.output_dir": str(tmp_path / name)})
        losses[name] = train_losses(tmp_path / name)
    assert losses["fp8"][1] != losses["bf16"][1]
    assert losses["fp8"] == pytest.approx(losses["bf16"], rel=5e-3)

    monkeypatch.setitem(sys.modules, "torchao", None)
    with pytest.raises(tpuplex.TpuplexError, match="pip install torchao"):
        tpuplex.train(config, "torch", overrides={"train.fp8": True, "runtime.output_dir": str(tmp_path / "none")})
    assert not Path(tmp_path / "none").exists()

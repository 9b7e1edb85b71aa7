"""SIGKILLs inside checkpoint writes, at steps after a checkpoint and during start-up, then resumes, on the torch
backend with a tiny BERT: the run ends bit for bit as an uninterrupted one (the same campaign as
tests/core/test_kill_campaign.py). The fast tier kills three times (one of each aim), the long tier ten times."""

from __future__ import annotations

import json

import pytest
from kill_campaign import run_campaign
from tiny_glue import write_run_config, write_tiny_model, write_tiny_mrpc


# Long only: the fast tier kills the torch flowers run (tests/torch/test_image_classification.py, 3 kills) and the
# numpy backend's (tests/core/test_kill_campaign.py, 10).
@pytest.mark.long
@pytest.mark.parametrize("kills", [10])
def test_kills_then_resume_equal_an_uninterrupted_run(kills, tmp_path) -> None:
    model, mrpc = write_tiny_model(tmp_path / "model"), write_tiny_mrpc(tmp_path / "MRPC")
    path = write_run_config(tmp_path, model, mrpc, train__epochs=6, runtime__checkpoint_every=1,
                            runtime__keep_checkpoints=2)
    killed, whole = tmp_path / "killed", tmp_path / "whole"

    def argv(output_dir):
        return ["train", str(path), "--backend", "torch", "--set", f"runtime.output_dir={json.dumps(str(output_dir))}"]

    landed = run_campaign(argv(killed), killed, argv(whole), whole, "tpuplex_torch.backend:TorchBackend",
                          kills=kills, startup_seconds=4.0)
    print("kills landed:", landed)
    assert len(landed) == kills and landed.count("write") == len(range(0, kills, 3))

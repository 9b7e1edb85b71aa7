"""Ten SIGKILLs at random moments and inside checkpoint writes, ten resumes: the numpy backend's run ends bit for
bit as an uninterrupted one (the torch session runs the same campaign, tests/torch/test_kill_campaign.py)."""

from __future__ import annotations

import json

from kill_campaign import run_campaign


def test_ten_kills_then_resume_equal_an_uninterrupted_run(write_config, tmp_path) -> None:
    path = write_config(train__epochs=12, runtime__checkpoint_every=1, runtime__keep_checkpoints=2)
    killed, whole = tmp_path / "killed", tmp_path / "whole"

    def argv(output_dir):
        return ["train", str(path), "--backend", "numpy", "--set", f"runtime.output_dir={json.dumps(str(output_dir))}"]

    landed = run_campaign(argv(killed), killed, argv(whole), whole, "tpuplex.testing.numpy_backend:NumpyBackend")
    print("kills landed:", landed)
    assert len(landed) == 10 and landed.count("write") >= 4

"""Ten SIGKILLs inside checkpoint writes, at steps after a checkpoint and during start-up, ten resumes: the numpy
backend's run ends bit for bit as an uninterrupted one (tests/common/kill_campaign.py; the torch session runs the
same campaign, tests/torch/test_kill_campaign.py). The numpy backend starts in a second, so the fast tier runs all
ten kills."""

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
    assert len(landed) == 10 and landed.count("write") == 4  # kills 0, 3, 6 and 9 held inside a write

"""`nox -s parity` inside the test suite: MiniLM and a tiny RoBERTa on real MRPC, dropout-off steps on each
backend, compared by examples/glue/parity.py's own bounds (initial logits 1e-4, every training loss and the dev
loss 1e-3 relative). The fast tier runs 10 steps: a wrong update (bias correction, weight decay, clipping,
schedule) moves the loss by more than 1e-3 within the first few; the long tier runs the full 50 of `nox -s parity`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PARITY = Path(__file__).resolve().parents[2] / "examples" / "glue" / "parity.py"


def parity(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PARITY), *args], capture_output=True, text=True, check=False,
                          timeout=1200, env={**os.environ, "HF_HUB_OFFLINE": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})


@pytest.mark.parametrize("steps", [10, pytest.param(50, marks=pytest.mark.long)])
def test_the_parity_scenarios_agree_on_every_backend(steps, shared_glue, tmp_path):
    runs = [parity("checkpoint", "--out", str(tmp_path))]
    runs += [parity("run", "--backend", backend, "--out", str(tmp_path), "--steps", str(steps))
             for backend in ("torch", "jax", "tf")]
    for done in runs:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    compared = parity("compare", str(tmp_path))
    assert compared.returncode == 0, compared.stdout + compared.stderr
    print(compared.stdout)
    expected = [f"{scenario}-{backend}.json" for scenario in ("bert", "roberta") for backend in ("jax", "tf", "torch")]
    assert sorted(p.name for p in tmp_path.glob("*.json")) == expected

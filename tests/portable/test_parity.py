"""`nox -s parity` inside the test suite: MiniLM and a tiny RoBERTa on real MRPC, 50 dropout-off steps on each
backend, compared by examples/glue/parity.py's own bounds (initial logits 1e-4, every loss 1e-3 relative, dev
accuracy 0.5 points)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PARITY = Path(__file__).resolve().parents[2] / "examples" / "glue" / "parity.py"


def parity(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PARITY), *args], capture_output=True, text=True, check=False,
                          timeout=1200, env={**os.environ, "HF_HUB_OFFLINE": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})


def test_the_parity_scenarios_agree_on_every_backend(shared_glue, tmp_path):
    steps = [parity("checkpoint", "--out", str(tmp_path))]
    steps += [parity("run", "--backend", backend, "--out", str(tmp_path)) for backend in ("torch", "jax", "tf")]
    for done in steps:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    compared = parity("compare", str(tmp_path))
    assert compared.returncode == 0, compared.stdout + compared.stderr
    expected = [f"{scenario}-{backend}.json" for scenario in ("bert", "roberta") for backend in ("jax", "tf", "torch")]
    assert sorted(p.name for p in tmp_path.glob("*.json")) == expected

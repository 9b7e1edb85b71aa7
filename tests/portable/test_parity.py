"""`nox -s parity` inside the test suite: MiniLM and a tiny RoBERTa on real MRPC, dropout-off steps on each
backend, compared by examples/glue/parity.py's own bounds (initial logits 1e-4, every training loss and the dev
loss 1e-3 relative). The long tier runs `nox -s parity` as it is (50 steps, 8 fitted lengths, all of MRPC, both
scenarios). The fast tier runs MiniLM's scenario alone, 10 steps of 8 rows over 2 fitted lengths on MRPC's first
100 training and dev rows (tests/common/shared_subset.py): a wrong update (bias correction, weight decay,
clipping, schedule) moves the loss by more than 1e-3 within the first few, whatever the batch, and on jax and tf
each length is a compiled program. It stays in the fast tier at over a minute: the one end-to-end run of a real
checkpoint (MiniLM) through the CLI's path on all three backends. The RoBERTa family trains alike on every backend
in the fast tier all the same (tests/{jax,tf}/test_families.py, 20 steps against the torch backend)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from shared_subset import subset_path

pytestmark = pytest.mark.started_first

PARITY = Path(__file__).resolve().parents[2] / "examples" / "glue" / "parity.py"


def parity(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PARITY), *args], capture_output=True, text=True, check=False,
                          timeout=1200, env={**os.environ, "HF_HUB_OFFLINE": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})


FAST = ("--set", "train.max_steps=10", "--set", "data.bucket_count=2", "--set", "train.global_batch=8")


@pytest.mark.parametrize("fast", [True, pytest.param(False, marks=pytest.mark.long)], ids=["fast", "as-nox-parity"])
def test_the_parity_scenarios_agree_on_every_backend(fast, shared_glue, tmp_path):
    settings, scenarios, runs = (), ("bert", "roberta"), []
    if fast:
        cut = subset_path(shared_glue.parent, shared_glue / "MRPC", tmp_path / "subset")
        settings, scenarios = (*FAST, "--set", f"data.data_dir={json.dumps(str(cut))}", "--scenario", "bert"), ("bert",)
    else:
        runs.append(parity("checkpoint", "--out", str(tmp_path)))
    runs += [parity("run", "--backend", backend, "--out", str(tmp_path), *settings)
             for backend in ("torch", "jax", "tf")]
    for done in runs:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    compared = parity("compare", str(tmp_path), *(("--scenario", "bert") if fast else ()))
    assert compared.returncode == 0, compared.stdout + compared.stderr
    print(compared.stdout)
    expected = [f"{scenario}-{backend}.json" for scenario in scenarios for backend in ("jax", "tf", "torch")]
    assert sorted(p.name for p in tmp_path.glob("*.json")) == expected

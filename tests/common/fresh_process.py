"""Commands as a user runs them, each in a fresh interpreter (only what it imports is loaded), and the tolerances
the workflow tests hold their results to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

METRIC_TOLERANCE = 1e-6
LOGIT_TOLERANCE = 1e-5


def tpuplex(*args: str, cwd: Path | None = None) -> str:
    """`python -m tpuplex *args` (run in `cwd`), which must succeed; its stdout."""
    done = subprocess.run([sys.executable, "-m", "tpuplex", *args], capture_output=True, text=True, check=False,
                          timeout=600, cwd=cwd, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def run_python(script: str, *args: str) -> np.ndarray:
    """`script` in a fresh interpreter (only what it imports is loaded); it prints a JSON list of logits."""
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=False,
                          timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr
    return np.array(json.loads(done.stdout.strip().splitlines()[-1]), np.float32)

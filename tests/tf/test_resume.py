"""Save at step k, restore in a fresh process, continue: parameters and both Adam moments equal an uninterrupted
run bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from scenario import RATES, backend, batches_and_rates, spec_and_optimizer

from tpuplex.engine import checkpoint

SAVE_AT = 2


def test_resume_in_a_fresh_process_equals_an_uninterrupted_run(tiny_dir, tmp_path):
    tf_backend = backend()
    spec, optimizer = spec_and_optimizer(tiny_dir)
    batches, rates = batches_and_rates()
    assert len(batches) == len(RATES)
    uninterrupted, _ = tf_backend.train_steps(tf_backend.init(spec, optimizer), batches, rates)
    expected = tf_backend.state_to_arrays(uninterrupted)

    first, _ = tf_backend.train_steps(tf_backend.init(spec, optimizer), batches[:SAVE_AT], rates[:SAVE_AT])
    saved = checkpoint.save(tmp_path / "ckpt", tf_backend.state_to_arrays(first), {"position": SAVE_AT}, keep=1)
    out = tmp_path / "resumed.npz"
    worker = Path(__file__).with_name("resume_worker.py")
    subprocess.run([sys.executable, str(worker), str(saved), str(tiny_dir), str(len(batches)), str(out)],
                   check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, cwd=worker.parent, timeout=300)

    resumed = np.load(out)
    assert int(resumed["step"]) == expected.step == len(batches)
    for kind in ("params", "exp_avg", "exp_avg_sq"):
        for name, array in getattr(expected, kind).items():
            np.testing.assert_array_equal(resumed[f"{kind}/{name}"], array, err_msg=f"{kind} {name}")

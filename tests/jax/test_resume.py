"""Save at step k, restore in a fresh process, continue: parameters and both Adam moments equal the uninterrupted
run bit for bit (dropout on)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from helpers import backend, encoded_split, model_spec

from tpuplex.data.batching import Batcher
from tpuplex.engine import checkpoint
from tpuplex.engine.schedule import warmup_linear_decay
from tpuplex.protocol import OptimizerSpec

DEVICES = 8
SAVE_AT = 2
WORKER = Path(__file__).with_name("resume_worker.py")


def optimizer_spec() -> OptimizerSpec:
    return OptimizerSpec(grad_accum=2, seed=7)


def planned_steps() -> list[tuple[dict, float]]:
    """The run's batches (one epoch of a seeded Batcher) and the core schedule's learning rates."""
    batches = list(Batcher(encoded_split(64), 16, DEVICES, seed=3).train_batches(epoch=0))
    return [(batch, warmup_linear_decay(step, peak=1e-3, warmup=1, total=len(batches)))
            for step, batch in enumerate(batches)]


def test_restore_in_a_fresh_process_continues_exactly(tiny_dir, tmp_path):
    steps = planned_steps()
    assert len(steps) == 4 > SAVE_AT
    jax_backend = backend(DEVICES)
    state = jax_backend.init(model_spec(tiny_dir, dropout=True), optimizer_spec())
    for number, (batch, learning_rate) in enumerate(steps):
        if number == SAVE_AT:
            saved = checkpoint.save(tmp_path / "checkpoints", jax_backend.state_to_arrays(state),
                                    {"epoch": 0, "position": SAVE_AT}, keep=2)
        state, _ = jax_backend.train_step(state, batch, learning_rate)
    uninterrupted = jax_backend.state_to_arrays(state)

    output = tmp_path / "resumed.npz"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WORKER.parent), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, str(WORKER), str(saved), str(tiny_dir), str(output)], env=env, check=True,
                   timeout=600)
    resumed = np.load(output)
    assert int(resumed["step"]) == uninterrupted.step == len(steps)
    for kind in ("params", "exp_avg", "exp_avg_sq"):
        for name, array in getattr(uninterrupted, kind).items():
            np.testing.assert_array_equal(resumed[f"{kind}/{name}"], array, err_msg=f"{kind} {name}")


def test_dropout_changes_the_update(tiny_dir):
    """The resume test is only meaningful if dropout masks are really drawn (and reproduced)."""
    batch, learning_rate = planned_steps()[0]
    results = []
    for dropout in (True, False):
        jax_backend = backend(DEVICES)
        state, loss = jax_backend.train_step(
            jax_backend.init(model_spec(tiny_dir, dropout=dropout), optimizer_spec()), batch, 1e-3)
        results.append(loss)
    assert results[0] != results[1]

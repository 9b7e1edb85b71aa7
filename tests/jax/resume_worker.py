"""Run by test_resume in a fresh process: restore a portable checkpoint, finish the run, save the final state.

    python resume_worker.py CHECKPOINT_STEP_DIR TINY_BERT_DIR OUTPUT.npz
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from helpers import backend, model_spec
from test_resume import DEVICES, optimizer_spec, planned_steps

from tpuplex.engine import checkpoint


def main(step_dir: Path, tiny_dir: Path, output: Path) -> None:
    arrays, trainer_state = checkpoint.load(step_dir)
    jax_backend = backend(DEVICES)
    state = jax_backend.state_from_arrays(jax_backend.init(model_spec(tiny_dir, dropout=True), optimizer_spec()),
                                          arrays)
    for batch, learning_rate in planned_steps()[trainer_state["optimizer_step"]:]:
        state, _ = jax_backend.train_step(state, batch, learning_rate)
    final = jax_backend.state_to_arrays(state)
    np.savez(output, step=final.step, **{f"params/{k}": v for k, v in final.params.items()},
             **{f"exp_avg/{k}": v for k, v in final.exp_avg.items()},
             **{f"exp_avg_sq/{k}": v for k, v in final.exp_avg_sq.items()})


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:4]))

"""Run in a fresh process by test_resume.py: restore a checkpoint, train on, save the parameters.

    python resume_worker.py CHECKPOINT_DIR MODEL_DIR STOP OUT.npz
"""

from __future__ import annotations

import sys

import numpy as np
from scenario import backend, batches_and_rates, spec_and_optimizer

from tpuplex.engine import checkpoint


def main(checkpoint_path: str, model_dir: str, stop: int, out: str) -> None:
    tf_backend = backend()
    spec, optimizer = spec_and_optimizer(model_dir)
    portable, trainer_state = checkpoint.load(checkpoint_path)
    state = tf_backend.state_from_arrays(tf_backend.init(spec, optimizer), portable)
    batches, rates = batches_and_rates()
    start = trainer_state["position"]
    state, _ = tf_backend.train_steps(state, batches[start:stop], rates[start:stop])
    final = tf_backend.state_to_arrays(state)
    np.savez(out, step=final.step, **{f"params/{k}": v for k, v in final.params.items()},
             **{f"exp_avg/{k}": v for k, v in final.exp_avg.items()},
             **{f"exp_avg_sq/{k}": v for k, v in final.exp_avg_sq.items()})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])

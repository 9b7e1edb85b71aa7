"""Every family on every backend, in figures: max |logit - HF transformers| (3 labels, fresh init) and the largest
relative gap to the torch backend's losses over 20 steps, on the tiny random checkpoints the tests write.

    .nox/tests-portable/bin/python benchmarks/family_parity.py     # any env with all three backends, repo root

The tests (tests/{jax,tf,torch}/test_families.py) assert the bounds (1e-4 and 1e-3); this prints the values.
"""
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "common"))
import numpy as np
from hf_families import FAMILIES, eval_batch, hf_logits, model_spec, train_batches, train_losses, write_checkpoint

from tpuplex.config import RuntimeConfig
from tpuplex.protocol import OptimizerSpec
from tpuplex_jax.backend import JaxBackend
from tpuplex_tf.backend import TfBackend
from tpuplex_torch.backend import TorchBackend

BACKENDS = {"torch": TorchBackend, "jax": JaxBackend, "tf": TfBackend}


def main() -> None:
    print(f"{'family':11} {'backend':7} {'max|dlogit| vs HF':>18} {'max rel dloss vs torch':>23}")
    for family in FAMILIES:
        folder = write_checkpoint(family, Path(tempfile.mkdtemp()))
        spec3, batch = model_spec(folder, num_labels=3), eval_batch(folder, num_labels=3)
        reference = hf_logits(spec3, batch)
        spec, batches = model_spec(folder), train_batches(folder, global_batch=8, count=20)
        torch_losses = np.asarray(train_losses(TorchBackend(RuntimeConfig()), spec, batches))
        for name, cls in BACKENDS.items():
            backend = cls(RuntimeConfig(cpu_devices=1))
            logits = backend.predict(backend.init(spec3, OptimizerSpec()), batch)
            losses = np.asarray(train_losses(cls(RuntimeConfig(cpu_devices=1)), spec, batches))
            print(f"{family:11} {name:7} {np.abs(logits - reference).max():18.2e} "
                  f"{(np.abs(losses - torch_losses) / torch_losses).max():23.2e}", flush=True)


if __name__ == "__main__":
    main()

"""How far a sharded mesh ends from the replicated run, and 8 replicas from 1 device (docs/sharding.md): 20 steps of
tests/jax/test_mesh.py's Llama and ResNet.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/investigations/mesh_parity.py
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "jax"))
import test_mesh as cases  # noqa: E402
from helpers import backend  # noqa: E402

from tpuplex.protocol import OptimizerSpec  # noqa: E402

STEPS = 20


def run(spec, mesh: dict, batches: list, optimizer: OptimizerSpec, devices: int = 8):
    jax_backend = backend(devices, mesh=mesh)
    state = jax_backend.init(spec, optimizer)
    state, losses = jax_backend.train_steps(state, batches, [cases.LEARNING_RATE] * len(batches))
    return np.array(losses), jax_backend.state_to_arrays(state)


def compare(run_a, run_b) -> str:
    (losses_a, a), (losses_b, b) = run_a, run_b
    distances = [np.abs(a.params[name] - b.params[name]) for name in a.params]
    over = sum(int(np.count_nonzero(d > 1e-5)) for d in distances)
    total = sum(d.size for d in distances)
    return (f"losses {np.max(np.abs(losses_a - losses_b) / losses_b):.1e} relative, parameters "
            f"max {max(d.max() for d in distances):.1e}, {over} of {total} more than 1e-5 apart")


def main() -> None:
    folder = pathlib.Path(tempfile.mkdtemp())
    resnet = cases.image_family_spec(cases.write_config(folder / "resnet", cases.RESNET), num_labels=3, dropout=False)
    for name, spec, batches, optimizer in (
            ("llama", cases.llama_spec(folder / "llama"), cases.token_batches(STEPS), cases.OPTIMIZER),
            ("resnet", resnet, cases.image_batches(STEPS), OptimizerSpec(grad_accum=2, seed=1))):
        replicated = run(spec, cases.REPLICATED, batches, optimizer)
        for mesh in ({"data": 2, "fsdp": 4}, {"data": 2, "fsdp": 2, "tensor": 2}):
            sharded = run(spec, mesh, batches, optimizer)
            print(f"{name} {mesh} against {cases.REPLICATED}: {compare(sharded, replicated)}")
        one_device = run(spec, {}, batches, optimizer, devices=1)
        print(f"{name} 1 device against {cases.REPLICATED}: {compare(one_device, replicated)}")


if __name__ == "__main__":
    main()

"""One backend's training step of nanoGPT's CPU model (examples/shakespeare_char/gpt-cpu/config.json), timed: 10
warm steps, then 5 rounds of 40, min and median ms per step. Run once per checkout, alternating, to compare two
versions of the decoder in one sitting (docs/benchmarks.md, "The decoder written once"):

    git worktree add /tmp/old 174912a
    PYTHONPATH=/tmp/old/packages/core/src:/tmp/old/packages/jax_backend/src python decoder_step_ab.py jax old
    python decoder_step_ab.py jax new
"""

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tpuplex import models
from tpuplex.config import RuntimeConfig
from tpuplex.kinds.decoder import Decoders
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex.tasks.causal_lm import TASK

CONFIG = Path(__file__).resolve().parents[2] / "examples/shakespeare_char/gpt-cpu/config.json"
BACKENDS = {"jax": "tpuplex_jax.backend:JaxBackend", "tf": "tpuplex_tf.backend:TfBackend",
            "torch": "tpuplex_torch.backend:TorchBackend"}


def main(backend_name: str, label: str) -> None:
    config = json.loads(CONFIG.read_text())
    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps(config))
    family, arch = models.architecture_of(config)
    kind = Decoders(folder, config, family, arch)
    spec = ModelSpec(kind=kind, task=TASK, inputs=TASK.inputs, head=TASK.head(family, arch, {}, None),
                     hf_config=config, family=family, arch=arch, params=kind.initial_state(None, 1)[0], dropout=False,
                     checkpoint_dir=folder)
    module, name = BACKENDS[backend_name].split(":")
    backend_class = getattr(__import__(module, fromlist=[name]), name)
    backend = backend_class(RuntimeConfig() if backend_name == "torch" else RuntimeConfig(cpu_devices=1))
    state = backend.init(spec, OptimizerSpec(weight_decay=0.1))
    ids = np.random.default_rng(0).integers(0, arch.vocab_size, (12, 65)).astype(np.int32)
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "weight": np.ones((12, 64), np.float32)}
    for _ in range(10):
        state, loss = backend.train_step(state, batch, 1e-3)
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(40):
            state, loss = backend.train_step(state, batch, 1e-3)
        float(loss)
        rounds.append((time.perf_counter() - started) / 40)
    print(f"{backend_name} {label} ms/step min {1e3 * min(rounds):.2f} median {1e3 * sorted(rounds)[2]:.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])

"""The training scenario test_resume.py runs in two processes (in one place so both run the same one)."""

from __future__ import annotations

from helpers import model_spec, random_split

from tpuplex.config import RuntimeConfig
from tpuplex.data.batching import Batcher
from tpuplex.protocol import ModelSpec, OptimizerSpec
from tpuplex_tf.backend import TfBackend

RATES = [1e-3, 2e-3, 2e-3, 1.5e-3, 1e-3, 5e-4]


def backend() -> TfBackend:
    return TfBackend(RuntimeConfig(cpu_devices=1))


def spec_and_optimizer(model_dir) -> tuple[ModelSpec, OptimizerSpec]:
    # Dropout on: a resumed run must also draw the same dropout masks.
    return model_spec(model_dir, dropout=True), OptimizerSpec(weight_decay=0.01, clip_norm=1.0, seed=7)


def batches_and_rates():
    """Six training batches [8, 16] and each one's learning rate."""
    batches = list(Batcher(random_split(48, 16, seed=11), 8, 1, seed=4).train_batches(epoch=0))
    return batches, RATES

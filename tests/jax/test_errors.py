"""Bad input is a TpuplexError with one clear line; devices, registry and profiler behave as configured."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import backend, batch_of, encoded_split, model_spec

from tpuplex import registry
from tpuplex.config import RuntimeConfig
from tpuplex.errors import TpuplexError
from tpuplex.protocol import OptimizerSpec


@pytest.fixture(scope="module")
def initialised(tiny_dir):
    jax_backend = backend(8)
    return jax_backend, jax_backend.init(model_spec(tiny_dir), OptimizerSpec(grad_accum=2))


def test_registry_builds_the_backend_on_the_asked_cpu_devices():
    jax_backend = registry.create("jax", RuntimeConfig(cpu_devices=4))
    topology = jax_backend.topology()
    assert (topology.kind, topology.device_count, topology.host_count) == ("cpu", 4, 1)
    assert len(jax_backend.devices) == 4


def test_global_batch_not_divisible_by_replicas(initialised):
    jax_backend, state = initialised
    with pytest.raises(TpuplexError, match=r"global_batch = 12 does not divide by the 8 replicas.*multiple of 8"):
        jax_backend.predict(state, batch_of(encoded_split(12)))


def test_rows_per_replica_not_divisible_by_grad_accum(initialised):
    jax_backend, state = initialised
    with pytest.raises(TpuplexError, match=r"train.grad_accum = 2 does not divide the 1 rows.*train.global_batch = 8"):
        jax_backend.train_step(state, batch_of(encoded_split(8)), 1e-3)


def test_checkpoint_that_does_not_match_the_model(initialised, tmp_path):
    jax_backend, state = initialised
    arrays = jax_backend.state_to_arrays(state)
    wrong_head = dict(arrays.params, **{"classifier.weight": np.zeros((3, 32), np.float32)})
    del wrong_head["bert.pooler.dense.bias"]
    with pytest.raises(TpuplexError) as raised:
        jax_backend.state_from_arrays(state, dataclasses.replace(arrays, params=wrong_head))
    message = str(raised.value)
    assert "\n" not in message
    assert "missing: bert.pooler.dense.bias" in message
    assert "classifier.weight (3, 32) != (2, 32)" in message
    moments = dict(arrays.exp_avg, unexpected_extra=np.zeros(1, np.float32))
    with pytest.raises(TpuplexError, match="checkpoint exp_avg does not match.*unexpected: unexpected_extra"):
        jax_backend.state_from_arrays(state, dataclasses.replace(arrays, exp_avg=moments))


def test_device_that_is_not_there():
    with pytest.raises(TpuplexError, match=r"device 'tpu' was asked for, but none was found"):
        backend(0, device="tpu")


def test_core_and_jax_disagree(monkeypatch):
    monkeypatch.setenv("TPU_NAME", "local-test-tpu")  # the core now "finds" a TPU that this jaxlib cannot use
    expected = r"the core found tpu .* but JAX cannot use it.*pip install '\./packages/jax_backend\[tpu\]'"
    with pytest.raises(TpuplexError, match=expected):
        backend(0, device="tpu")


def test_more_cpu_devices_than_jax_started_with():
    with pytest.raises(TpuplexError, match=r"cpu_devices = 16 but JAX already runs with 8 CPU device\(s\)"):
        backend(16)


def test_cpu_devices_with_an_accelerator_asked_for():
    with pytest.raises(TpuplexError, match=r"runtime.cpu_devices = 2 splits the CPU, but runtime.device = 'gpu'"):
        backend(2, device="gpu")


def test_profiler_writes_a_trace(initialised, tmp_path):
    jax_backend, state = initialised
    jax_backend.start_profile(tmp_path)
    jax_backend.predict(state, batch_of(encoded_split(16)))
    jax_backend.stop_profile()
    # Where TensorBoard's profile plugin looks: <logdir>/plugins/profile/<run>/<host>.xplane.pb
    traces = list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))
    assert traces and all(trace.stat().st_size > 0 for trace in traces)

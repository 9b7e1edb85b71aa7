"""Bad input ends in one TpuplexError that names the problem and the fix."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from helpers import LOGICAL_CPUS, model_spec

from tpuplex.config import RuntimeConfig
from tpuplex.errors import TpuplexError
from tpuplex.protocol import OptimizerSpec
from tpuplex_tf.backend import TfBackend

TPU_VARIABLES = ("TPU_NAME", "TPU_ACCELERATOR_TYPE", "COLAB_TPU_ADDR", "TPU_WORKER_HOSTNAMES", "KAGGLE_TPU")


@pytest.fixture
def no_tpu_env(monkeypatch):
    for name in (*TPU_VARIABLES, "TPUPLEX_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def state_and_backend(tiny_dir):
    backend = TfBackend(RuntimeConfig(cpu_devices=1))
    return backend.init(model_spec(tiny_dir), OptimizerSpec()), backend


def test_announced_tpu_that_cannot_start_takes_the_tpu_branch_and_fails_clearly(no_tpu_env):
    resolver_calls = []
    real_resolver = tf.distribute.cluster_resolver.TPUClusterResolver

    def spy(*args, **kwargs):
        resolver_calls.append(kwargs)
        return real_resolver(*args, **kwargs)

    no_tpu_env.setenv("TPU_NAME", "my-tpu")
    no_tpu_env.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", spy)
    with pytest.raises(TpuplexError, match=r"a TPU is announced \(env TPU_NAME\) but TensorFlow could not "
                                           r"initialise it .*runtime.device = \"cpu\"") as raised:
        TfBackend(RuntimeConfig())
    assert resolver_calls == [{"tpu": None}]  # the resolver read TPU_NAME itself, as in Colab and Kaggle
    assert "\n" not in str(raised.value)


def test_asking_for_a_missing_device(no_tpu_env):
    for device in ("tpu", "gpu"):
        with pytest.raises(TpuplexError, match=f"device '{device}' was asked for, but none was found"):
            TfBackend(RuntimeConfig(device=device))


def test_more_cpu_devices_than_the_initialised_split():
    with pytest.raises(TpuplexError, match=f"runtime.cpu_devices = {2 * LOGICAL_CPUS}, but TensorFlow was "
                                           f"initialised .* with {LOGICAL_CPUS} CPU device"):
        TfBackend(RuntimeConfig(cpu_devices=2 * LOGICAL_CPUS))


def test_checkpoint_that_does_not_match_the_model(state_and_backend):
    state, backend = state_and_backend
    arrays = backend.state_to_arrays(state)
    wrong = dataclasses.replace(arrays, params=dict(arrays.params))
    del wrong.params["bert.pooler.dense.bias"]
    wrong.params["classifier.weight"] = np.zeros((5, 32), np.float32)
    wrong.params["bert.extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(TpuplexError, match=r"missing: bert.pooler.dense.bias; unexpected: bert.extra.weight; "
                                           r"wrong shape: classifier.weight \(5, 32\) != \(2, 32\)"):
        backend.state_from_arrays(state, wrong)


def test_grad_accum_that_does_not_split_the_replica_rows(tiny_dir):
    backend = TfBackend(RuntimeConfig(cpu_devices=1))
    state = backend.init(model_spec(tiny_dir), OptimizerSpec(grad_accum=3))
    batch = {"input_ids": np.ones((4, 8), np.int32), "token_type_ids": np.zeros((4, 8), np.int32),
             "attention_mask": np.ones((4, 8), np.int32), "labels": np.zeros(4, np.int32)}
    with pytest.raises(TpuplexError, match="train.grad_accum = 3 does not divide the 4 rows"):
        backend.train_step(state, batch, 1e-3)


def test_bf16_is_refused_clearly(tiny_dir):
    with pytest.raises(TpuplexError, match="train.bf16 = true is supported by the tf backend for the image families"):
        TfBackend(RuntimeConfig(cpu_devices=1)).init(model_spec(tiny_dir), OptimizerSpec(bf16=True))


def test_a_sharded_mesh_is_refused_in_one_line_and_a_data_only_mesh_is_data_parallel(tiny_dir, tmp_path, capsys):
    """TensorFlow keeps every parameter whole on each device (docs/sharding.md): fsdp or tensor above 1 is one
    `tpuplex: error:` line and exit 2, before anything is written; a mesh of `data` alone is today's data
    parallelism."""
    from tpuplex import registry

    with pytest.raises(TpuplexError, match=r"the tf backend does not do .*--backend jax"):
        registry.create("tf", RuntimeConfig(cpu_devices=2, mesh={"data": 1, "fsdp": 2}))
    assert registry.create("tf", RuntimeConfig(cpu_devices=LOGICAL_CPUS, mesh={"data": -1})).topology().device_count \
        == LOGICAL_CPUS
    with pytest.raises(TpuplexError, match=r"runtime.mesh = \{'data': 3\} does not fit the"):
        registry.create("tf", RuntimeConfig(cpu_devices=LOGICAL_CPUS, mesh={"data": 3}))

    from tpuplex.commands import cli

    output, config = tmp_path / "run", tmp_path / "sharded.toml"
    config.write_text(f'[model]\ncheckpoint = "{tiny_dir}"\n[data]\nmax_length = 32\n'
                      f'[runtime]\noutput_dir = "{output}"\nmesh = {{fsdp = 2}}\n')
    status = cli.main(["train", str(config), "--backend", "tf"])
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1 and "tpuplex: error: runtime.mesh" in error
    assert not output.exists()

"""Device discovery from a simulated environment (no device files, no nvidia-smi unless a test provides one)."""

from __future__ import annotations

import pytest

from tpuplex import hardware as devices
from tpuplex.errors import TpuplexError


@pytest.fixture(autouse=True)
def bare_machine(monkeypatch):
    """No /dev/accel*, no /proc/driver/nvidia, no nvidia-smi: only the environment a test passes counts."""
    monkeypatch.setattr(devices.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(devices, "_nvidia_smi_count", lambda: 0)


def test_nothing_found_is_one_cpu() -> None:
    topology = devices.discover(env={})
    assert (topology.kind, topology.device_count, topology.host_count) == ("cpu", 1, 1)
    assert topology.report() == "cpu x1 (1 process) via the fallback (no TPU or GPU found)"


@pytest.mark.parametrize(
    ("env", "count", "hosts", "source"),
    [
        ({"TPU_NAME": "my-tpu"}, 1, 1, "env TPU_NAME"),
        ({"TPU_ACCELERATOR_TYPE": "v4-8"}, 4, 1, "env TPU_ACCELERATOR_TYPE"),  # v2-v4 names count cores
        ({"TPU_ACCELERATOR_TYPE": "v5litepod-4"}, 4, 1, "env TPU_ACCELERATOR_TYPE"),  # v5+ names count chips
        ({"COLAB_TPU_ADDR": "10.0.0.2:8470"}, 1, 1, "env COLAB_TPU_ADDR"),
        ({"TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_ACCELERATOR_TYPE": "v4-16"}, 8, 2, "env TPU_ACCELERATOR_TYPE"),
    ],
)
def test_tpu_from_environment(env, count: int, hosts: int, source: str) -> None:
    topology = devices.discover(env=env)
    assert (topology.kind, topology.device_count, topology.host_count) == ("tpu", count, hosts)
    assert topology.source == source


def test_worker_id_is_the_process_index() -> None:
    assert devices.discover(env={"TPU_NAME": "pod", "TPU_WORKER_ID": "3"}).process_index == 3


def test_tpu_chips_from_device_files(monkeypatch) -> None:
    monkeypatch.setattr(devices.glob, "glob",
                        lambda pattern: [f"/dev/accel{i}" for i in range(4)] if pattern == "/dev/accel*" else [])
    topology = devices.discover(env={})
    assert (topology.kind, topology.device_count, topology.source) == ("tpu", 4, "/dev/accel*")


@pytest.mark.parametrize(("visible", "count"), [(None, 4), ("0,2", 2), ("1", 1)])
def test_gpus_limited_by_cuda_visible_devices(monkeypatch, visible, count: int) -> None:
    monkeypatch.setattr(devices, "_nvidia_smi_count", lambda: 4)
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    topology = devices.discover(env=env)
    assert (topology.kind, topology.device_count, topology.source) == ("gpu", count, "nvidia-smi")


@pytest.mark.parametrize("hidden", ["", "-1"])
def test_cuda_visible_devices_can_hide_every_gpu(monkeypatch, hidden: str) -> None:
    monkeypatch.setattr(devices, "_nvidia_smi_count", lambda: 4)
    assert devices.discover(env={"CUDA_VISIBLE_DEVICES": hidden}).kind == "cpu"


def test_tpu_is_preferred_over_gpu(monkeypatch) -> None:
    monkeypatch.setattr(devices, "_nvidia_smi_count", lambda: 2)
    assert devices.discover(env={"TPU_NAME": "t"}).kind == "tpu"


def test_override_to_cpu_where_a_tpu_is_found() -> None:
    env = {"TPU_NAME": "t", "TPUPLEX_DEVICE": "cpu"}
    topology = devices.discover(env=env)
    assert (topology.kind, topology.device_count, topology.source) == ("cpu", 1, "override (found tpu)")


def test_config_override_wins_over_the_environment_variable() -> None:
    assert devices.discover("cpu", env={"TPU_NAME": "t", "TPUPLEX_DEVICE": "tpu"}).kind == "cpu"
    assert devices.discover("auto", env={"TPU_NAME": "t", "TPUPLEX_DEVICE": "auto"}).kind == "tpu"


@pytest.mark.parametrize(("override", "env"), [("tpu", {}), (None, {"TPUPLEX_DEVICE": "gpu"})])
def test_asking_for_a_device_that_is_absent(override, env) -> None:
    with pytest.raises(TpuplexError) as error:
        devices.discover(override, env=env)
    message = str(error.value)
    assert "was asked for, but none was found" in message and "cpu x1" in message
    assert 'runtime.device = "auto"' in message


def test_unknown_device_name() -> None:
    with pytest.raises(TpuplexError, match="device 'npu' is not known: use one of auto, tpu, gpu, cpu"):
        devices.discover(env={"TPUPLEX_DEVICE": "npu"})


def test_report_is_one_line() -> None:
    topology = devices.Topology("tpu", 8, host_count=2, process_index=1, source="env TPU_NAME", detail="pmap")
    assert topology.report() == "tpu x8 (process 1 of 2) via env TPU_NAME [pmap]"

"""tpuplex launch: each child gets the variables its framework's own launcher would set."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tpuplex.commands import launch
from tpuplex.errors import TpuplexError


def test_every_child_gets_torchrun_jax_and_tf_config_variables() -> None:
    first, second = launch.environments(2, [1000, 1001, 1002, 1003])
    assert (first["RANK"], second["RANK"], second["WORLD_SIZE"], first["MASTER_PORT"]) == ("0", "1", "2", "1000")
    assert (second["JAX_COORDINATOR_ADDRESS"], second["JAX_PROCESS_ID"], second["JAX_NUM_PROCESSES"]) == (
        "127.0.0.1:1001", "1", "2")
    assert json.loads(second["TF_CONFIG"]) == {"cluster": {"worker": ["127.0.0.1:1002", "127.0.0.1:1003"]},
                                               "task": {"type": "worker", "index": 1}}


def test_the_child_is_python_m_tpuplex_with_the_cpu_devices() -> None:
    assert launch.child_command(["train", "c.toml", "--backend", "jax"], 2) == [
        sys.executable, "-m", "tpuplex", "train", "c.toml", "--backend", "jax", "--set", "runtime.cpu_devices=2"]


def test_only_train_commands_are_launched() -> None:
    with pytest.raises(TpuplexError, match="tpuplex launch runs a train command"):
        launch.child_command(["devices"], 0)


def test_free_ports_are_distinct_free_and_never_ones_the_kernel_hands_out() -> None:
    import socket

    ports = launch.free_ports(4)
    low, _ = launch._ephemeral_range()
    assert len(set(ports)) == 4 and all(1024 <= port < low for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind((launch.LOCALHOST, port))
    # A port the kernel assigns by itself comes from its ephemeral range, so it never collides with ours.
    with socket.socket() as sock:
        sock.bind((launch.LOCALHOST, 0))
        assert sock.getsockname()[1] >= low


CHILD = """
import os, sys, time
index = int(os.environ["RANK"])
for part in ("runtime.mesh does not fit", " the 4 devices: move those devices to fsdp"):  # one line, two writes
    sys.stderr.write(part)
    sys.stderr.flush()
    time.sleep(0.05)
if index == 0:
    print("validation: loss 1.0")
print(os.environ.get("OMP_NUM_THREADS"))
sys.stdout.write("no newline at the end")
"""


def test_several_processes_speak_in_whole_prefixed_lines(monkeypatch, capfd) -> None:
    monkeypatch.setattr(launch, "child_command", lambda command, devices: [sys.executable, "-c", CHILD])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert launch.launch(["train", "c.toml", "--backend", "torch"], 3) == 0
    out, err = capfd.readouterr()
    lines = err.splitlines()
    assert lines[0].startswith("tpuplex launch: OMP_NUM_THREADS is unset: each of the 3 torch processes uses ")
    assert sorted(lines[1:]) == [f"[process {i}] runtime.mesh does not fit the 4 devices: move those devices to fsdp"
                                 for i in range(3)]
    threads = str(max(1, len(os.sched_getaffinity(0)) // 3))
    assert sorted(out.splitlines()) == sorted(["validation: loss 1.0", threads, "no newline at the end",
                                               *(f"[process {i}] {text}" for i in (1, 2)
                                                 for text in (threads, "no newline at the end"))])
    assert out.endswith("\n")


def test_only_process_0_prints_a_run_s_results(write_config, monkeypatch, capsys) -> None:
    from tpuplex.commands import cli

    path = write_config(train__max_steps=1)
    monkeypatch.setenv("RANK", "1")
    assert cli.main(["train", str(path), "--backend", "numpy"]) == 0
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "0")
    assert cli.main(["train", str(path), "--backend", "numpy"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("results: ")

"""`tpuplex launch`: several processes of one run on this machine, for tests and laptops.

    tpuplex launch --processes 2 [--cpu-devices 2] -- train CONFIG --backend jax ...

Each child is `python -m tpuplex <command...>` with the variables each framework's own launcher sets, so the
backends join the run exactly as they do on a cluster:

    torch   MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE   (as torchrun)
    jax     JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID                  (jax.distributed)
    tf      TF_CONFIG with one worker per process                                          (MultiWorkerMirroredStrategy)

`--cpu-devices K` gives every process K CPU devices (`runtime.cpu_devices`). SIGTERM and SIGINT are passed on to
every child, which then stop together after the same step (`tpuplex.hosts`). The launcher exits with the first
non-zero status of a child, or 0; it never kills a child itself: a child that loses a peer ends on its own within
`runtime.host_timeout`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tpuplex.engine.preemption import SIGNALS
from tpuplex.errors import TpuplexError

LOCALHOST = "127.0.0.1"


def environments(processes: int, ports: Sequence[int]) -> list[dict[str, str]]:
    """The variables of each of `processes` children; `ports`: torch's, JAX's, then one per TF worker."""
    torch_port, jax_port, *worker_ports = ports
    workers = [f"{LOCALHOST}:{port}" for port in worker_ports]
    return [{"MASTER_ADDR": LOCALHOST, "MASTER_PORT": str(torch_port), "RANK": str(index),
             "WORLD_SIZE": str(processes), "LOCAL_RANK": str(index), "LOCAL_WORLD_SIZE": str(processes),
             "JAX_COORDINATOR_ADDRESS": f"{LOCALHOST}:{jax_port}", "JAX_NUM_PROCESSES": str(processes),
             "JAX_PROCESS_ID": str(index),
             "TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})}
            for index in range(processes)]


def child_command(command: Sequence[str], cpu_devices: int) -> list[str]:
    """`python -m tpuplex <command>`, with `--set runtime.cpu_devices=K` for a train command when asked."""
    if not command or command[0] != "train":
        raise TpuplexError(f"tpuplex launch runs a train command (got {' '.join(command) or 'nothing'}): "
                           "tpuplex launch --processes N -- train CONFIG --backend NAME")
    extra = ["--set", f"runtime.cpu_devices={cpu_devices}"] if cpu_devices else []
    return [sys.executable, "-m", "tpuplex", *command, *extra]


def launch(command: Sequence[str], processes: int, cpu_devices: int = 0) -> int:
    """Run `command` in `processes` local processes (see the module doc); returns the launcher's exit status."""
    if processes < 1:
        raise TpuplexError(f"--processes {processes}: use 1 or more")
    argv = child_command(command, cpu_devices)
    children = [subprocess.Popen(argv, env={**os.environ, **env})
                for env in environments(processes, free_ports(processes + 2))]

    def forward(number: int, frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(number)

    previous = {number: signal.signal(number, forward) for number in SIGNALS}
    try:
        statuses = [child.wait() for child in children]
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    failed = next((status for status in statuses if status != 0), 0)
    return failed if failed >= 0 else 128 - failed  # killed by signal N: 128 + N, as a shell reports it


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports, free now on localhost, drawn below the kernel's ephemeral range.

    The children bind them a moment later. Between the two, a port the kernel hands out by itself (to a `bind(0)`
    or an outgoing connection anywhere on the machine) could be taken; ports below the ephemeral range are never
    handed out that way, so only a program that binds that very port explicitly could."""
    low = _ephemeral_range()[0]
    candidates = random.Random().sample(range(max(1024, low - 12000), low), 200)
    found = []
    for port in candidates:
        with socket.socket() as sock:
            try:
                sock.bind((LOCALHOST, port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise TpuplexError(f"found only {len(found)} free TCP ports of {count} on {LOCALHOST}: free some ports and "
                       "launch again")


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for automatically assigned ports (Linux's default when it cannot be read)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999

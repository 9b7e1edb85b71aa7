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

One voice from several processes: with more than one, each child's output comes through the launcher line by line,
each line whole and ending in a newline, so two processes' lines never run together; every stderr line (and any
stdout line of a process other than 0) starts with `[process i] `; process 0's stdout (the results, which only
process 0 prints) comes as it is. A torch run's threads are set once here (`OMP_NUM_THREADS`: the cores shared
among the processes, the choice accelerate would make and warn about in every process) when the variable is unset.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

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
    shared = {**os.environ, **torch_threads(command, processes)}
    relayed = processes > 1
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE} if relayed else {}
    children = [subprocess.Popen(argv, env={**shared, **env}, **pipes)
                for env in environments(processes, free_ports(processes + 2))]
    lock = threading.Lock()
    relays = [threading.Thread(target=relay, args=(stream, target, prefix, lock), daemon=True)
              for index, child in enumerate(children) if relayed
              for stream, target, prefix in ((child.stdout, sys.stdout, "" if index == 0 else f"[process {index}] "),
                                             (child.stderr, sys.stderr, f"[process {index}] "))]
    for thread in relays:
        thread.start()

    def forward(number: int, frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(number)

    previous = {number: signal.signal(number, forward) for number in SIGNALS}
    try:
        statuses = [child.wait() for child in children]
        for thread in relays:  # a grandchild that outlives its process (and holds its pipe) is not waited for
            thread.join(timeout=10)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    failed = next((status for status in statuses if status != 0), 0)
    return failed if failed >= 0 else 128 - failed  # killed by signal N: 128 + N, as a shell reports it


def relay(stream: BinaryIO, target: TextIO, prefix: str, lock: threading.Lock) -> None:
    """Copy `stream` to the text stream `target` line by line, each line whole, after `prefix` and ending in a
    newline (a last line without one gets it), under `lock` so that no two relays' lines run together."""
    start = prefix.encode()
    for line in iter(stream.readline, b""):
        text = start + line.rstrip(b"\n") + b"\n"
        with lock:
            target.flush()
            out = getattr(target, "buffer", None)
            if out is not None:
                out.write(text)
                out.flush()
            else:  # a text stream without bytes (a test's capture)
                target.write(text.decode(errors="replace"))
                target.flush()
    stream.close()


def torch_threads(command: Sequence[str], processes: int) -> dict[str, str]:
    """OMP_NUM_THREADS for a torch run's children when it is unset ({} otherwise): the cores this launcher may
    use shared among the processes, said once here rather than in accelerate's warning from every process."""
    if processes < 2 or os.environ.get("OMP_NUM_THREADS") or _backend(command) != "torch":
        return {}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // processes)
    print(f"tpuplex launch: OMP_NUM_THREADS is unset: each of the {processes} torch processes uses {threads} "
          f"thread(s), {cores} cores shared among them (set OMP_NUM_THREADS to choose)", file=sys.stderr, flush=True)
    return {"OMP_NUM_THREADS": str(threads)}


def _backend(command: Sequence[str]) -> str:
    """The value of the command's --backend ("" when it gives none)."""
    for index, part in enumerate(command):
        if part == "--backend" and index + 1 < len(command):
            return command[index + 1]
        if part.startswith("--backend="):
            return part.partition("=")[2]
    return ""


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

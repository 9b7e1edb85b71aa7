"""Several processes, one run: which rows each feeds, what they must agree on, and how they stop together.

Every process of a multi-process run (TPU pod hosts, GPU hosts, or `tpuplex launch` on one machine) runs the same
program on the same data: it builds the same global batches from the seed, feeds only its own rows
(`process_rows`), and gets the global results back from the backend (losses, and logits of every row, gathered by
the framework's collectives). What only the core can check goes through the backend's one host collective,
`Backend.host_allgather`:
- `Hosts.agree`: the config hash, the data and the resume step must be equal on every process, or every process
  stops with one line naming the values;
- `Hosts.any`: a SIGTERM on one process stops all of them after the same step;
- `Hosts.all_ok`: process 0 writes the run's outputs and every process its slices of a checkpoint; none goes on
  before all have, and each learns whether all succeeded.

A process that dies or never arrives leaves the others blocked inside a collective, where no exception reaches
Python (jax waits forever on CPU). `Watchdog` ends such a process after `runtime.host_timeout` seconds without
progress (`runtime.start_timeout` until its first step is done: start-up and the first compilation take each
process its own time), with one line on stderr and exit status `HOST_LOST_EXIT`; a collective that fails by itself
(gloo sees the peer's socket close) raises `HostLost` with the same line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator, Mapping

import numpy as np

from tpuplex.errors import TpuplexError

HOST_LOST_EXIT = 69
"""Exit status when another process of the run was lost: EX_UNAVAILABLE. Rerunning every process resumes."""

PROCESS_COUNT_ENV = ("WORLD_SIZE", "JAX_NUM_PROCESSES", "TPUPLEX_PROCESSES")


def process_rows(rows: int, process_index: int, process_count: int) -> slice:
    """The contiguous rows of a global batch of `rows` that process `process_index` of `process_count` feeds.

    Process p takes rows [p * rows / P, (p + 1) * rows / P): every backend places its replicas process-major, so the
    process's block is its replicas' blocks in order. `rows` must divide by the process count (batch sizes divide
    by the replica count, a multiple of it).
    """
    if rows % process_count:
        raise TpuplexError(f"a batch of {rows} rows does not split over {process_count} processes: use a batch size "
                           f"that divides by the number of devices")
    share = rows // process_count
    return slice(process_index * share, (process_index + 1) * share)


def expected_processes(env: Mapping[str, str] | None = None) -> int:
    """How many processes the environment says this run has (1 when it says nothing), before any framework
    starts: torchrun's WORLD_SIZE, JAX_NUM_PROCESSES, TPU_WORKER_HOSTNAMES or TF_CONFIG's worker list."""
    env = os.environ if env is None else env
    counts = [int(env[name]) for name in PROCESS_COUNT_ENV if env.get(name, "").isdigit()]
    counts.append(len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]))
    if env.get("TF_CONFIG"):
        try:
            counts.append(len(json.loads(env["TF_CONFIG"]).get("cluster", {}).get("worker", [])))
        except (ValueError, AttributeError):
            pass  # the tf backend reports a malformed TF_CONFIG itself
    return max([1, *counts])


PROCESS_INDEX_ENV = ("RANK", "JAX_PROCESS_ID", "TPU_WORKER_ID")


def expected_process_index(env: Mapping[str, str] | None = None) -> int:
    """This process's index among the run's as the environment says it (0 when it says nothing): torchrun's RANK,
    JAX_PROCESS_ID, a TPU VM's TPU_WORKER_ID or TF_CONFIG's task index. What prints once per run (the CLI's
    results) prints on process 0 alone."""
    env = os.environ if env is None else env
    indices = [int(env[name]) for name in PROCESS_INDEX_ENV if env.get(name, "").isdigit()]
    if env.get("TF_CONFIG"):
        try:
            indices.append(int(json.loads(env["TF_CONFIG"]).get("task", {}).get("index", 0)))
        except (ValueError, TypeError, AttributeError):
            pass  # the tf backend reports a malformed TF_CONFIG itself
    return max([0, *indices])


class HostLost(Exception):
    """Another process of the run stopped or never arrived; this one stops too (exit `HOST_LOST_EXIT`)."""


def lost_message(what: str, process_index: int, process_count: int, cause: str) -> str:
    """The one line for a lost process; `process_index` -1 when this process does not know its index yet."""
    who = f"process {process_index} of {process_count}" if process_index >= 0 else f"one of {process_count} processes"
    return (f"{who} stopped during {what}: {cause}; another process has died "
            "or never arrived (see its output). Start every process again with the same command to resume from "
            "the last checkpoint")


class Watchdog:
    """Ends this process when a watched section makes no progress for `timeout` seconds, or `start_timeout`
    before `started()` is called (see the module doc).

    `watch(what)` arms it for one section; sections nest (the innermost names the wait). Disabled (every `watch`
    a no-op) when `enabled` is False, as in single-process runs, where a long first compile is no fault.
    """

    def __init__(self, timeout: float, process_index: int = 0, process_count: int = 1, enabled: bool = True,
                 start_timeout: float | None = None):
        self.timeout = timeout
        self.start_timeout = timeout if start_timeout is None else start_timeout
        self.process_index, self.process_count = process_index, process_count
        self.enabled = enabled
        self.starting = True
        self._sections: list[tuple[str, float, str]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watch(self, what: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        limit, setting = ((self.start_timeout, "runtime.start_timeout") if self.starting
                          else (self.timeout, "runtime.host_timeout"))
        with self._lock:
            self._sections.append((what, time.monotonic() + limit, f"no progress for {limit:g} s ({setting})"))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tpuplex-watchdog", daemon=True)
                self._thread.start()
        try:
            yield
        except HostLost:
            raise
        except Exception as error:
            if self.process_count > 1 and _looks_like_a_lost_peer(error):
                cause = f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
                raise HostLost(lost_message(what, self.process_index, self.process_count, cause)) from error
            raise
        finally:
            with self._lock:
                self._sections.pop()

    def started(self) -> None:
        """This process's first step is done: sections armed from now on get `timeout`."""
        self.starting = False

    def _run(self) -> None:
        while True:
            with self._lock:
                overdue = [(what, cause) for what, deadline, cause in self._sections if time.monotonic() > deadline]
            if overdue:
                what, cause = overdue[-1]
                line = lost_message(what, self.process_index, self.process_count, cause)
                sys.stderr.write(f"tpuplex: error: {line}\n")
                sys.stderr.flush()
                os._exit(HOST_LOST_EXIT)
            time.sleep(min(1.0, self.timeout / 10, self.start_timeout / 10))


_PEER_ERRORS = ("connection reset", "connection closed", "connection refused", "broken pipe", "unavailable",
                "unhealthy", "socket closed", "peer", "collective ops is aborted", "timed out", "timeout")


def _looks_like_a_lost_peer(error: Exception) -> bool:
    """Whether a framework's error from a collective says a peer went away (gloo, gRPC, XLA's coordination)."""
    text = str(error).lower()
    return any(marker in text for marker in _PEER_ERRORS)


class Hosts:
    """The processes of one run as one process sees them, over the backend's `host_allgather`.

    Every method is collective: all processes call it at the same point, or the run stalls until the watchdog
    ends it. With one process each returns at once without a collective.
    """

    def __init__(self, backend, timeout: float, start_timeout: float | None = None):
        topology = backend.topology()
        self.count, self.index = topology.host_count, topology.process_index
        self._backend = backend
        self.watchdog = Watchdog(timeout, self.index, self.count, enabled=self.count > 1, start_timeout=start_timeout)

    @classmethod
    def alone(cls) -> Hosts:
        """One process with no backend (a tool writing a checkpoint by itself)."""
        hosts = cls.__new__(cls)
        hosts.count, hosts.index, hosts._backend = 1, 0, None
        hosts.watchdog = Watchdog(0.0, enabled=False)
        return hosts

    @property
    def writer(self) -> bool:
        """Whether this process writes the run's files (process 0)."""
        return self.index == 0

    def agree(self, what: str, value: str, fix: str) -> None:
        """Raise TpuplexError on every process unless `value` is the same on all of them."""
        if self.count == 1:
            return
        # 16-bit pieces of the digest: float64 holds them exactly, whatever dtype a framework's collective takes.
        digest = np.frombuffer(hashlib.sha256(value.encode()).digest()[:8], np.uint16).astype(np.float64)
        values = self.gather(f"checking {what}", digest)
        differing = [p for p in range(self.count) if not np.array_equal(values[p], values[0])]
        if differing:
            raise TpuplexError(f"the processes of this run disagree on {what} (process {differing[0]} differs from "
                               f"process 0; this one, process {self.index}, has {value[:64]!r}): {fix}")

    def any(self, flag: bool, what: str) -> bool:
        """Whether `flag` is set on at least one process."""
        if self.count == 1:
            return flag
        return bool(self.gather(what, np.array([float(flag)])).max() > 0)

    def shared_token(self, what: str) -> int:
        """A random 32-bit number, the same on every process (process 0's draw)."""
        # Two 16-bit halves, exact whatever dtype a framework's collective takes.
        halves = np.frombuffer(secrets.token_bytes(4), np.uint16).astype(np.float64)
        if self.count > 1:
            halves = self.gather(what, halves)[0]
        return int(halves[0]) << 16 | int(halves[1])

    def all_ok(self, ok: bool, what: str) -> bool:
        """Whether `ok` holds on every process (a barrier: no process passes before all have arrived)."""
        if self.count == 1:
            return ok
        return bool(self.gather(what, np.array([float(ok)])).min() > 0)

    def gather(self, what: str, values: np.ndarray) -> np.ndarray:
        """Every process's `values` (small float vectors, exact as float32), one row per process."""
        with self.watchdog.watch(what):
            gathered = np.asarray(self._backend.host_allgather(values.astype(np.float64)), np.float64)
        if gathered.shape != (self.count, *values.shape):
            raise RuntimeError(f"host_allgather of {values.shape} returned {gathered.shape} with {self.count} "
                               "processes")
        return gathered

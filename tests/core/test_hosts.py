"""tpuplex.hosts: the rows each process feeds, the agreement checks, and the watchdog that ends a stalled process.

The real collectives run in the backend sessions (tests/*/test_multihost.py); here a fake backend plays several
processes through `host_allgather`.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_collate import encoded

from tpuplex.data.batching import Batcher
from tpuplex.errors import TpuplexError
from tpuplex.hardware import Topology
from tpuplex.hosts import (
    HOST_LOST_EXIT,
    HostLost,
    Hosts,
    Watchdog,
    expected_process_index,
    expected_processes,
    process_rows,
)


@settings(max_examples=60, deadline=None)
@given(processes=st.sampled_from([1, 2, 4]), per_process=st.sampled_from([1, 2, 3]), per_replica=st.integers(1, 3),
       lengths=st.lists(st.integers(1, 24), min_size=1, max_size=70), buckets=st.lists(st.integers(1, 30),
                                                                                       max_size=3))
def test_process_slices_are_disjoint_and_cover_every_evaluation_example_once(processes, per_process, per_replica,
                                                                              lengths, buckets) -> None:
    replicas = processes * per_process
    batcher = Batcher(encoded(lengths), replicas * per_replica, replicas, buckets)
    seen = np.zeros(len(lengths), np.int64)
    for item in batcher.eval_batches():
        rows = len(item.index)
        slices = [process_rows(rows, p, processes) for p in range(processes)]
        covered = np.concatenate([np.arange(rows)[s] for s in slices])
        np.testing.assert_array_equal(covered, np.arange(rows))  # disjoint, in order, nothing left out
        for s in slices:
            assert s.stop - s.start == rows // processes  # equal shares: one program shape on every process
            mine = item.index[s]
            np.add.at(seen, mine[mine >= 0], 1)
    np.testing.assert_array_equal(seen, 1)


def test_a_batch_that_does_not_split_over_the_processes_is_one_line() -> None:
    with pytest.raises(TpuplexError, match="6 rows does not split over 4 processes"):
        process_rows(6, 0, 4)


def test_expected_processes_reads_every_launcher_s_variables() -> None:
    assert expected_processes({}) == 1
    assert expected_processes({"WORLD_SIZE": "4"}) == 4
    assert expected_processes({"JAX_NUM_PROCESSES": "2"}) == 2
    assert expected_processes({"TPU_WORKER_HOSTNAMES": "a,b,c,d"}) == 4
    assert expected_processes({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:2", "c:3"]}}'}) == 3
    assert expected_processes({"TF_CONFIG": "not json"}) == 1


def test_expected_process_index_reads_every_launcher_s_variables() -> None:
    assert expected_process_index({}) == 0
    assert expected_process_index({"RANK": "3", "WORLD_SIZE": "4"}) == 3
    assert expected_process_index({"JAX_PROCESS_ID": "1"}) == expected_process_index({"TPU_WORKER_ID": "1"}) == 1
    assert expected_process_index({"TF_CONFIG": '{"cluster": {}, "task": {"type": "worker", "index": 2}}'}) == 2
    assert expected_process_index({"TF_CONFIG": "not json"}) == 0


class FakeProcesses:
    """Process `index` of `count`, whose peers sent `peers[p]` to every host_allgather (its own row is real)."""

    name = "fake"

    def __init__(self, index: int, count: int, peers: dict[int, list[float]] | None = None):
        self.index, self.count, self.peers = index, count, peers or {}
        self.calls = 0

    def topology(self) -> Topology:
        return Topology("cpu", self.count, host_count=self.count, process_index=self.index)

    def host_allgather(self, values: np.ndarray) -> np.ndarray:
        self.calls += 1
        return np.stack([values if p == self.index else np.asarray(self.peers.get(p, values), np.float64)
                         for p in range(self.count)])


def test_agreement_passes_when_every_process_has_the_same_value() -> None:
    backend = FakeProcesses(1, 2)
    Hosts(backend, timeout=30).agree("the configuration", "abc", "fix it")
    assert backend.calls == 1


def test_disagreement_stops_with_one_line_naming_the_process() -> None:
    backend = FakeProcesses(0, 3, peers={2: [1.0, 2.0, 3.0, 4.0]})
    with pytest.raises(TpuplexError, match=r"disagree on the configuration \(process 2 differs from process 0; "
                                           r"this one, process 0, has 'abc'\): start every process alike"):
        Hosts(backend, timeout=30).agree("the configuration", "abc", "start every process alike")


def test_one_process_needs_no_collective() -> None:
    backend = FakeProcesses(0, 1)
    hosts = Hosts(backend, timeout=30)
    hosts.agree("the configuration", "abc", "fix it")
    assert hosts.any(True, "flag") and not hosts.any(False, "flag") and hosts.all_ok(True, "ok") and hosts.writer
    assert backend.calls == 0 and not hosts.watchdog.enabled


def test_a_signal_on_any_process_stops_all_and_a_failed_write_fails_all() -> None:
    hosts = Hosts(FakeProcesses(1, 2, peers={0: [1.0]}), timeout=30)
    assert hosts.any(False, "the preemption check") and not hosts.writer
    failed_writer = Hosts(FakeProcesses(1, 2, peers={0: [0.0]}), timeout=30)
    assert not failed_writer.all_ok(True, "the checkpoint")


def test_a_collective_that_fails_on_a_lost_peer_is_host_lost() -> None:
    watchdog = Watchdog(30, process_index=0, process_count=2)
    with pytest.raises(HostLost, match="process 0 of 2 stopped during step 3: RuntimeError: .*Connection reset by "
                                       "peer.*another process has died"):
        with watchdog.watch("step 3"):
            raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    with pytest.raises(ValueError), watchdog.watch("step 4"):
        raise ValueError("a shape mismatch in the model")


@pytest.mark.parametrize(("watchdog", "setting"), [
    ("Watchdog(1.0, 1, 2, start_timeout=600.0); watchdog.started()", "runtime.host_timeout"),
    ("Watchdog(600.0, 1, 2, start_timeout=1.0)", "runtime.start_timeout"),  # before the first step is done
])
def test_a_stalled_process_exits_with_one_line_after_the_timeout(watchdog, setting) -> None:
    stalled = (f"import time; from tpuplex.hosts import Watchdog\nwatchdog = {watchdog}\n"
               "with watchdog.watch('the checkpoint of step 8'):\n    time.sleep(60)\n")
    done = subprocess.run([sys.executable, "-c", stalled], capture_output=True, text=True, timeout=300)
    assert done.returncode == HOST_LOST_EXIT
    assert done.stderr.strip() == (
        f"tpuplex: error: process 1 of 2 stopped during the checkpoint of step 8: no progress for 1 s ({setting}); "
        "another process has died or never arrived (see its output). Start every process again with the same "
        "command to resume from the last checkpoint")  # the watchdog, not the sleep, ended it


def test_the_watchdog_is_off_for_one_process() -> None:
    watchdog = Watchdog(0.01, enabled=False)
    with watchdog.watch("step 1"):
        time.sleep(0.1)
    assert watchdog._thread is None

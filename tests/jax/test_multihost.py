"""Two processes (jax.distributed, CPU collectives over gloo) with 2 CPU devices each train like one process with
4: same losses, parameters and dev metrics, dropout on. See tests/common/multihost_checks.py."""

from __future__ import annotations

import pytest
from multihost_checks import (
    check_kill_all_and_resume,
    check_lost_process,
    check_preempting_one_process_stops_all,
    check_same_run,
    launched,
    one_process,
    write_setup,
)

BACKEND, DEVICES_PER_PROCESS = "jax", 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory, minilm_dir, shared_glue):
    folder = tmp_path_factory.mktemp("multihost")
    config = write_setup(folder, minilm_dir, shared_glue / "MRPC")
    single = one_process(config, BACKEND, folder / "one", 2 * DEVICES_PER_PROCESS)
    multi = launched(2, DEVICES_PER_PROCESS, config, BACKEND, folder / "two")
    return folder, config, single, multi


def test_two_processes_train_like_one(runs) -> None:
    folder, _, single, multi = runs
    check_same_run(folder / "one", folder / "two", single, multi)
    assert multi["topology"].startswith("cpu x4 (2 hosts, process 0)")


def test_killed_processes_resume_to_the_same_parameters(runs) -> None:
    folder, config, _, _ = runs
    check_kill_all_and_resume(config, BACKEND, folder, DEVICES_PER_PROCESS, folder / "two")


def test_a_signal_to_one_process_stops_all_at_the_same_step(runs) -> None:
    folder, config, _, _ = runs
    check_preempting_one_process_stops_all(config, BACKEND, folder, DEVICES_PER_PROCESS, folder / "two")


def test_a_lost_process_stops_the_other(runs) -> None:
    folder, config, _, _ = runs
    seconds = check_lost_process(config, BACKEND, folder, DEVICES_PER_PROCESS, timeout=20)
    print(f"process 0 stopped {seconds:.1f} s after process 1 was killed")

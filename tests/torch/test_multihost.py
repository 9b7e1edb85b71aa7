"""Two eager processes (torch.distributed over gloo, through accelerate) train like one process: same losses,
parameters and dev metrics. One eager process has one device (several need torch_mode = "xla"), so the reference
runs the same global batches on one device instead of two. Dropout is off: every process draws its rows' masks
from the same per-step seed, so with dropout two processes draw other masks than one. See
tests/common/multihost_checks.py."""

from __future__ import annotations

import pytest
from multihost_checks import (
    check_kill_all_and_resume,
    check_lost_process,
    check_missing_process,
    check_preempting_one_process_stops_all,
    check_processes_must_agree,
    check_same_run,
    launched,
    one_process,
    write_setup,
)

BACKEND, NO_DROPOUT = "torch", "model.dropout=false"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, minilm_dir, shared_glue):
    folder = tmp_path_factory.mktemp("multihost")
    config = write_setup(folder, minilm_dir, shared_glue / "MRPC")
    single = one_process(config, BACKEND, folder / "one", 0, NO_DROPOUT)
    multi = launched(2, 0, config, BACKEND, folder / "two", NO_DROPOUT)
    return folder, config, single, multi


def test_two_processes_train_like_one(runs) -> None:
    folder, _, single, multi = runs
    check_same_run(folder / "one", folder / "two", single, multi)
    assert single["topology"].startswith("cpu x1 (1 host, process 0)")
    assert multi["topology"].startswith("cpu x2 (2 hosts, process 0)")


def test_killed_processes_resume_to_the_same_parameters(runs) -> None:
    folder, config, _, _ = runs
    check_kill_all_and_resume(config, BACKEND, folder, 0, folder / "two", NO_DROPOUT)


def test_a_signal_to_one_process_stops_all_at_the_same_step(runs) -> None:
    folder, config, _, _ = runs
    check_preempting_one_process_stops_all(config, BACKEND, folder, 0, folder / "two", NO_DROPOUT)


def test_a_lost_process_stops_the_other(runs) -> None:
    folder, config, _, _ = runs
    seconds = check_lost_process(config, BACKEND, folder, 0, 20, NO_DROPOUT)
    print(f"process 0 stopped {seconds:.1f} s after process 1 was killed")


def test_processes_with_different_configs_stop_before_the_first_step(runs) -> None:
    folder, config, _, _ = runs
    check_processes_must_agree(config, BACKEND, folder, NO_DROPOUT)


def test_a_process_that_never_arrives_stops_the_other(runs) -> None:
    folder, config, _, _ = runs
    seconds = check_missing_process(config, BACKEND, folder, 15, NO_DROPOUT)
    print(f"process 0 stopped {seconds:.1f} s after it started alone")

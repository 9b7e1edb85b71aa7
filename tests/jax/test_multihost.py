"""Two processes (jax.distributed, CPU collectives over gloo) with 2 CPU devices each train like one process with
4: same losses, parameters and dev metrics, dropout on. See tests/common/multihost_checks.py."""

from __future__ import annotations

import pytest
from multihost_checks import MultiProcessSuite

pytestmark = pytest.mark.started_first


class TestJaxProcesses(MultiProcessSuite):
    # JAX on CPU notices the loss only by the watchdog's runtime.host_timeout (lost_timeout), so the check takes
    # about that long after the kill. The join at start-up waits runtime.start_timeout instead: on a loaded 2-core
    # machine the two processes reached it more than 20 s apart (importing jax and torch).
    backend, devices, single_devices, lost_timeout = "jax", 2, 4, 20

    @pytest.mark.long  # the torch session runs this check in the fast tier
    def test_preempted_then_killed_processes_resume_to_the_same_state(self, runs) -> None:
        super().test_preempted_then_killed_processes_resume_to_the_same_state(runs)

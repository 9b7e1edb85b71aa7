"""Two processes (jax.distributed, CPU collectives over gloo) with 2 CPU devices each train like one process with
4: same losses, parameters and dev metrics, dropout on. See tests/common/multihost_checks.py."""

from __future__ import annotations

import pytest
from multihost_checks import MultiProcessSuite


class TestJaxProcesses(MultiProcessSuite):
    backend, devices, single_devices = "jax", 2, 4

    @pytest.mark.long  # the torch session runs this check in the fast tier
    def test_preempted_then_killed_processes_resume_to_the_same_state(self, runs) -> None:
        super().test_preempted_then_killed_processes_resume_to_the_same_state(runs)

"""Two MultiWorkerMirroredStrategy workers (TF_CONFIG on localhost, one CPU device each) train like one process
with a MirroredStrategy over 2 logical CPU devices: same losses, parameters and dev metrics, dropout on. See
tests/common/multihost_checks.py."""

from __future__ import annotations

import pytest
from multihost_checks import MultiProcessSuite

pytestmark = pytest.mark.started_first


class TestTfProcesses(MultiProcessSuite):
    # TF's health check stops the survivor by itself (about 10 s); the timeout only has to exceed that.
    backend, devices, single_devices, lost_timeout = "tf", 0, 2, 60

    @pytest.mark.long  # the torch session runs this check in the fast tier
    def test_preempted_then_killed_processes_resume_to_the_same_state(self, runs) -> None:
        super().test_preempted_then_killed_processes_resume_to_the_same_state(runs)

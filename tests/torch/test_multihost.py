"""Two eager processes (torch.distributed over gloo, through accelerate) train like one process: same losses,
parameters and dev metrics. One eager process has one device (several need torch_mode = "xla"), so the reference
runs the same global batches on one device instead of two. Dropout is off: every process draws its rows' masks
from the same per-step seed, so with dropout two processes draw other masks than one. See
tests/common/multihost_checks.py. The two start-up faults run here only, the backend whose processes start fastest.
"""

from __future__ import annotations

import pytest
from multihost_checks import MultiProcessSuite, check_missing_process, check_processes_must_agree

pytestmark = pytest.mark.started_first


class TestTorchProcesses(MultiProcessSuite):
    backend, sets = "torch", ("model.dropout=false",)

    def test_processes_with_different_configs_stop_before_the_first_step(self, runs) -> None:
        folder, config, _, _ = runs
        check_processes_must_agree(config, self.backend, folder, *self.sets)

    def test_a_process_that_never_arrives_stops_the_other(self, runs) -> None:
        folder, config, _, _ = runs
        seconds = check_missing_process(config, self.backend, folder, 15, *self.sets)
        print(f"torch: process 0 stopped {seconds:.1f} s after it started alone")

"""Two processes (jax.distributed, CPU collectives over gloo) with 2 CPU devices each train like one process with
4: same losses, parameters and dev metrics, dropout on. See tests/common/multihost_checks.py."""

from __future__ import annotations

from multihost_checks import MultiProcessSuite


class TestJaxProcesses(MultiProcessSuite):
    backend, devices, single_devices = "jax", 2, 4

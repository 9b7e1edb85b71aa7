"""Fixtures for the JAX backend tests. The session sets XLA_FLAGS=--xla_force_host_platform_device_count=8 so one
process can compare 1 and 8 replicas; a bare `pytest tests/jax` gets the same flag here, before JAX starts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tpuplex.testing.tiny_bert import write_tiny_bert

FORCE_8_DEVICES = "--xla_force_host_platform_device_count=8"
if FORCE_8_DEVICES not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FORCE_8_DEVICES}".strip()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return write_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), seed=0)

"""TF test session: the host CPU is split into 8 logical devices before TensorFlow initialises.

Backends are constructed with `runtime.cpu_devices` = 1 (OneDeviceStrategy) or 8 (MirroredStrategy over the 8
logical devices), so one process compares one device with eight.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# pytest puts tests/ on sys.path for tests/conftest.py; its jax/ and torch/ folders then import as empty namespace
# packages named like the frameworks, and Keras, probing for an installed JAX, takes tests/jax for it.
_TESTS = Path(__file__).resolve().parents[1]
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _TESTS]

import pytest  # noqa: E402
from helpers import LOGICAL_CPUS  # noqa: E402

from tpuplex.testing.tiny_bert import write_tiny_bert  # noqa: E402
from tpuplex_tf.devices import split_host_cpu  # noqa: E402

split_host_cpu(LOGICAL_CPUS)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> os.PathLike:
    return write_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), seed=3)

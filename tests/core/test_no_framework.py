"""The core never imports an ML framework: not on import, not during a whole numpy-backend run.

A framework module is named after its framework (`jax.py`, `tf.py`, `torch.py`: a task's or a model kind's parts in
that framework, and the contracts and shared layers they build on); only that framework's backend imports it. Every
other module is imported here, and the import-linter contracts (`.importlinter`) hold the same line statically.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

FRAMEWORKS = ("tensorflow", "torch", "jax", "flax")

# Imports every tpuplex module, runs a whole training run, and prints the framework modules that got loaded.
IMPORT_EVERYTHING_AND_RUN = """
import importlib, json, pkgutil, sys
import tpuplex
for module in pkgutil.walk_packages(tpuplex.__path__, "tpuplex."):
    if module.name.rsplit(".", 1)[1] in ("jax", "tf", "torch"):
        continue  # a framework module: imported by that framework's backend only
    if module.name != "tpuplex.__main__":  # running it would parse this script's arguments
        importlib.import_module(module.name)
from tpuplex.commands.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in FRAMEWORKS)}))
""".replace("FRAMEWORKS", repr(FRAMEWORKS))


@pytest.mark.parametrize("distribution", ["tensorflow", "tensorflow-cpu", "torch", "jax", "jaxlib", "flax"])
def test_the_core_session_has_no_framework_installed(distribution: str) -> None:
    # Asked of the installed distributions, not of import paths: pytest puts tests/ on sys.path, where the
    # tests/jax and tests/torch folders would pass for namespace packages.
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution(distribution)


def test_importing_everything_and_training_loads_no_framework(write_config, tmp_path) -> None:
    """Decoy framework packages sit first on the path: importing any of them, even inside a try (as tensorboardX
    does for torch), would leave it in sys.modules."""
    decoys = tmp_path / "decoys"
    for name in FRAMEWORKS:
        (decoys / name).mkdir(parents=True)
        (decoys / name / "__init__.py").write_text("")
    path_entries = [str(decoys), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERYTHING_AND_RUN, "train", str(write_config()), "--backend", "numpy"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path_entries)},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report == {"code": 0, "loaded": []}
    assert (tmp_path / "run" / "results.json").is_file()

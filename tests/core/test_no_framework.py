"""The core never imports an ML framework: not in its source (any import statement, at any level), not on import,
not during a whole numpy-backend run.

What a framework runs (its op table, a kind's parameter holder, a task's loss in that framework) lives in that
framework's backend package (`tpuplex_<backend>.ops`, `.kinds`, `.tasks`); every core module is imported here,
and the import-linter contracts (`.importlinter`) hold the same line statically.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FRAMEWORKS = ("tensorflow", "torch", "jax", "flax")
IMPORTED_NOWHERE = ("torch", "torch_xla", "accelerate", "jax", "jaxlib", "flax", "optax", "tensorflow", "keras")
"""What no core source file imports, at module or function level."""
CORE_SOURCE = Path(__file__).resolve().parents[2] / "packages" / "core" / "src" / "tpuplex"

# Imports every tpuplex module, runs a whole training run, and prints the framework modules that got loaded.
IMPORT_EVERYTHING_AND_RUN = """
import importlib, json, pkgutil, sys
import tpuplex
for module in pkgutil.walk_packages(tpuplex.__path__, "tpuplex."):
    if module.name != "tpuplex.__main__":  # running it would parse this script's arguments
        importlib.import_module(module.name)
from tpuplex.commands.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in FRAMEWORKS)}))
""".replace("FRAMEWORKS", repr(FRAMEWORKS))


def imported_modules(source: Path) -> set[str]:
    """The top-level packages every import statement of `source` names, at any depth of its syntax tree."""
    found = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_no_core_source_imports_a_framework() -> None:
    sources = sorted(CORE_SOURCE.rglob("*.py"))
    assert len(sources) > 100  # the scan reads the core, not an empty folder
    offenders = {str(source.relative_to(CORE_SOURCE)): sorted(imported_modules(source) & set(IMPORTED_NOWHERE))
                 for source in sources}
    assert {name: found for name, found in offenders.items() if found} == {}
    assert [source.name for source in sources if source.stem in ("jax", "tf", "torch")] == []


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

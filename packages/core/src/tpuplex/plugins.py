"""Plug-ins named by import path ("package.module:Attribute"): a task of your own (`task.name`), your own model
(`model.architecture`), and the framework modules of tasks and model kinds. They import from the folders
`add_search_path` adds (the working directory and the config file's), after everything installed.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Any

from tpuplex.errors import ConfigError

IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def check_import_path(architecture: str) -> None:
    """Raise one clear error unless `architecture` looks like `package.module:Attribute` (with `{backend}`
    allowed in the module part)."""
    if not IMPORT_PATH.match(architecture.replace("{backend}", "backend")):
        raise ConfigError(f"model.architecture = {architecture!r} is not an import path: write "
                          "\"package.module:ClassName\" (or leave it empty for the checkpoint's own family)")


_added: list[str] = []
"""The folders `add_search_path` put on sys.path, in order: what a run records, so that reading it again later
(export, predict, generate) imports a model or task of your own as training did."""


def add_search_path(folder: Path) -> None:
    """Let user models import from `folder` (after everything installed, so they never shadow a library)."""
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    if str(folder) not in _added:
        _added.append(str(folder))


def search_paths() -> list[str]:
    """The folders `add_search_path` added in this process."""
    return list(_added)


def import_object(path: str, field: str) -> Any:
    """The object `package.module:attribute` names, imported now; `field` (e.g. "task.name = 'x'") starts the one
    clear error when it cannot be."""
    module_name, attribute = path.split(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"{field} cannot be imported ({type(error).__name__}: {error}): make {module_name} "
                          "importable (pip install -e your package, or add its folder to PYTHONPATH)") from None
    return found


def construct(path: str, what: str, contract: type) -> Any:
    """An instance of the subclass of `contract` that `path` ("package.module:Class") names, imported now; `what`
    names it in the one clear error (a framework module of a task or a model kind)."""
    found = import_object(path, what)
    if not (isinstance(found, type) and issubclass(found, contract)):
        raise ConfigError(f"{what} ({path}) is not a {contract.__module__}.{contract.__qualname__}: subclass it")
    return found()

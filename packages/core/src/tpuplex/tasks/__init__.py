"""The tasks tpuplex trains, by name; a task of your own is named by import path.

    [task]
    name = "masked_lm"                  # a built-in task (BUILTIN), or "my_package.my_task:TASK"
    mask_probability = 0.15             # the task's own options (its `Options` dataclass)

Adding a built-in task is one folder under `tpuplex/tasks/` plus one line in BUILTIN (docs/tasks.md).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import types
from collections.abc import Mapping
from typing import Any

from tpuplex.errors import TpuplexError
from tpuplex.models.user import import_object
from tpuplex.tasks.base import Head, Task, TaskData

BUILTIN: dict[str, str] = {
    "sequence_classification": "tpuplex.tasks.sequence_classification:TASK",
    "masked_lm": "tpuplex.tasks.masked_lm:TASK",
    "token_classification": "tpuplex.tasks.token_classification:TASK",
    "image_classification": "tpuplex.tasks.image_classification:TASK",
}
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def get(name: str) -> Task:
    """The task `[task] name` names: a built-in one, or `package.module:ATTRIBUTE` (a `Task` instance)."""
    path = BUILTIN.get(name, name)
    if not _IMPORT_PATH.match(path):
        raise TpuplexError(f"task.name = {name!r} is not a task: use one of {', '.join(BUILTIN)} or the import path "
                           "of your own, \"package.module:TASK\"")
    found = import_object(path, f"task.name = {name!r}")
    if not isinstance(found, Task):
        raise TpuplexError(f"task.name = {name!r} is a {type(found).__name__}, not a tpuplex.tasks.Task instance")
    return found


def options(task: Task, given: Mapping[str, Any]) -> Any:
    """The task's `Options` from the `[task]` fields besides `name`, each checked (unknown fields named)."""
    from tpuplex.config import build_section

    return build_section("task", task.Options, dict(given))


def backend_module(task: Task, backend: str) -> types.ModuleType:
    """The task's module for `backend` (its head and loss in that framework), imported now."""
    path = task.backends.get(backend)
    if path is None:
        raise TpuplexError(f"the {task.name} task has no {backend} module: use one of the backends "
                           f"{', '.join(task.backends)}")
    return importlib.import_module(path)


def option_fields(task: Task) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(task.Options))


__all__ = ["BUILTIN", "Head", "Task", "TaskData", "backend_module", "get", "option_fields", "options"]

"""The tasks tpuplex trains, by name; a task of your own is named by import path.

    [task]
    name = "masked_lm"                  # a built-in task (BUILTIN), or "my_package.my_task:TASK"
    mask_probability = 0.15             # the task's own options (its `Options` dataclass)

Adding a built-in task is one folder under `tpuplex/tasks/` plus one line in BUILTIN (docs/tasks.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tpuplex.config import build_section
from tpuplex.errors import ConfigError
from tpuplex.plugins import IMPORT_PATH, construct, import_object
from tpuplex.tasks.base import Head, Task, TaskData

BUILTIN: dict[str, str] = {
    "sequence_classification": "tpuplex.tasks.sequence_classification:TASK",
    "masked_lm": "tpuplex.tasks.masked_lm:TASK",
    "token_classification": "tpuplex.tasks.token_classification:TASK",
    "image_classification": "tpuplex.tasks.image_classification:TASK",
    "causal_lm": "tpuplex.tasks.causal_lm:TASK",
    "seq2seq": "tpuplex.tasks.seq2seq:TASK",
    "span_corruption": "tpuplex.tasks.span_corruption:TASK",
    "speech_recognition": "tpuplex.tasks.speech_recognition:TASK",
}


def get(name: str) -> Task:
    """The task `[task] name` names: a built-in one, or `package.module:ATTRIBUTE` (a `Task` instance)."""
    path = BUILTIN.get(name, name)
    if not IMPORT_PATH.match(path):
        raise ConfigError(f"task.name = {name!r} is not a task: use one of {', '.join(BUILTIN)} or the import path "
                          "of your own, \"package.module:TASK\"")
    found = import_object(path, f"task.name = {name!r}")
    if not isinstance(found, Task):
        raise ConfigError(f"task.name = {name!r} is a {type(found).__name__}, not a tpuplex.tasks.Task instance")
    return found


def options(task: Task, given: Mapping[str, Any]) -> Any:
    """The task's `Options` from the `[task]` fields besides `name`, each checked (unknown fields named)."""
    return build_section("task", task.Options, dict(given))


def framework_module(task: Task, framework: str, contract: type) -> Any:
    """The task's module for `framework` (`Task.backends`: "package.module:Class", a subclass of `contract`, the
    framework's `TaskModule` in `tpuplex.tasks.<framework>`), imported and constructed now."""
    path = task.backends.get(framework)
    if path is None:
        raise ConfigError(f"the {task.name} task has no {framework} module: use one of the backends "
                          f"{', '.join(task.backends)}")
    module = construct(path, f"the {task.name} task's {framework} module", contract)
    module.name = task.name
    return module


def option_fields(task: Task) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(task.Options))


__all__ = ["BUILTIN", "Head", "Task", "TaskData", "framework_module", "get", "option_fields", "options"]

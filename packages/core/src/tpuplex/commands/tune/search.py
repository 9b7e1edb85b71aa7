"""The `[tune]` table of a config, checked against the config it searches (`parse_search`), and its metric against
what the task reports (`check_metric`): every bad entry is one ConfigError line before the study or any trial."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import re
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from tpuplex import config as config_lib
from tpuplex import tasks
from tpuplex.config import Config
from tpuplex.errors import ConfigError

DISTRIBUTIONS = ("log_uniform", "uniform", "int", "choice")
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "hyperband", "successive_halving", "none")
DIRECTIONS = ("maximize", "minimize")
LOWER_IS_BETTER = re.compile(r"(^|_)(loss|perplexity|wer|cer|error)$")
"""Metric names whose default direction is "minimize"."""
DEFAULT_TRIALS = 20
SECTIONS = ("task", "model", "data", "train", "runtime")


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One entry of [tune.space]: a config field ("train.learning_rate") and its distribution."""

    field: str
    kind: str
    """One of DISTRIBUTIONS."""
    values: tuple[Any, ...]
    """[low, high] for log_uniform, uniform and int; the choices for choice."""

    def suggest(self, trial: Any) -> Any:
        """The trial's value (a retried trial gets its own again)."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.field, list(self.values))
        if self.kind == "int":
            return trial.suggest_int(self.field, self.values[0], self.values[1])
        return trial.suggest_float(self.field, self.values[0], self.values[1], log=self.kind == "log_uniform")

    def grid(self) -> list[Any]:
        return list(self.values) if self.kind == "choice" else list(range(self.values[0], self.values[1] + 1))

    def spec(self) -> dict[str, list[Any]]:
        return {self.kind: list(self.values)}


@dataclasses.dataclass(frozen=True)
class Search:
    """The [tune] table, checked."""

    metric: str
    direction: str
    trials: int
    sampler: str
    pruner: str
    seed: int
    space: tuple[Dimension, ...]
    study: str
    pruner_startup_trials: int
    pruner_warmup_steps: int
    heartbeat_interval: int
    grace_period: int
    max_retry: int
    plots: bool

    @property
    def split(self) -> str:
        return self.metric.partition(".")[0]

    @property
    def name(self) -> str:
        return self.metric.partition(".")[2]

    def fingerprint(self, config_hash: str, backend: str) -> dict[str, Any]:
        """What a study is for: runs of one config on one backend, scored by one metric, over one space."""
        return {"space": {dim.field: dim.spec() for dim in self.space}, "metric": self.metric,
                "direction": self.direction, "config_hash": config_hash, "backend": backend}


_FIELDS: dict[str, tuple[type, Any]] = {
    "metric": (str, None), "direction": (str, None), "trials": (int, None), "sampler": (str, "tpe"),
    "pruner": (str, "median"), "seed": (int, 0), "space": (dict, None), "study": (str, ""),
    "pruner_startup_trials": (int, 5), "pruner_warmup_steps": (int, 0), "heartbeat_interval": (int, 60),
    "grace_period": (int, 0), "max_retry": (int, 3), "plots": (bool, True),
}
"""[tune]'s fields: (type, default); None: required or derived."""


def parse_search(table: Mapping[str, Any], base: Config, default_study: str = "tpuplex") -> Search:
    """The [tune] table checked against the config it searches: every bad entry is one ConfigError line."""
    unknown = sorted(set(table) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"unknown field tune.{unknown[0]}: [tune] has {', '.join(_FIELDS)}")
    values: dict[str, Any] = {}
    for name, (kind, default) in _FIELDS.items():
        value = table.get(name, default)
        if value is None:
            values[name] = None
            continue
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"tune.{name} = {value!r} is not allowed: use an integer")
        if kind is not int and not isinstance(value, kind):
            what = {str: "a string", bool: "true or false", dict: "a table"}[kind]
            raise ConfigError(f"tune.{name} = {value!r} is not allowed: use {what}")
        values[name] = value
    metric = values["metric"]
    if metric is None:
        raise ConfigError('tune.metric is missing: name the evaluation metric to optimise, e.g. metric = '
                          '"dev.accuracy" (<eval split>.<metric>)')
    split, dot, name = metric.partition(".")
    if not split or not dot or not name:
        raise ConfigError(f'tune.metric = {metric!r} is not allowed: use <eval split>.<metric>, e.g. "dev.accuracy"')
    direction = values["direction"] or ("minimize" if LOWER_IS_BETTER.search(name) else "maximize")
    for field, allowed in (("direction", DIRECTIONS), ("sampler", SAMPLERS), ("pruner", PRUNERS)):
        chosen = direction if field == "direction" else values[field]
        if chosen not in allowed:
            raise ConfigError(f"tune.{field} = {chosen!r} is not allowed: use one of {', '.join(allowed)}")
    space = values["space"]
    if not space:
        raise ConfigError('tune.space is empty: give each field to search and its distribution, e.g. [tune.space] '
                          '"train.learning_rate" = {log_uniform = [1e-5, 1e-3]}')
    dimensions = tuple(_dimension(field, spec, base) for field, spec in space.items())
    if values["sampler"] == "grid":
        continuous = [dim.field for dim in dimensions if dim.kind not in ("choice", "int")]
        if continuous:
            raise ConfigError(f"tune.space {continuous[0]!r} is continuous: the grid sampler needs choice or int "
                              "dimensions (or use sampler = \"tpe\" or \"random\")")
    points = math.prod(len(dim.grid()) for dim in dimensions) if values["sampler"] == "grid" else 0
    trials = values["trials"]
    if trials is None:
        trials = points or DEFAULT_TRIALS
    if trials < 1:
        raise ConfigError(f"tune.trials = {trials} is not allowed: use 1 or more trials")
    if points and trials > points:
        raise ConfigError(f"tune.trials = {trials} is more than the grid's {points} points: use at most {points}")
    for name in ("pruner_startup_trials", "pruner_warmup_steps", "max_retry", "grace_period"):
        if values[name] < 0:
            raise ConfigError(f"tune.{name} = {values[name]} is not allowed: use a number of at least 0")
    if values["heartbeat_interval"] < 1:
        raise ConfigError(f"tune.heartbeat_interval = {values['heartbeat_interval']} is not allowed: use 1 or more "
                          "seconds")
    grace = values["grace_period"] or 2 * values["heartbeat_interval"]
    if grace <= values["heartbeat_interval"]:
        raise ConfigError(f"tune.grace_period = {grace} is not allowed: use more than tune.heartbeat_interval = "
                          f"{values['heartbeat_interval']} seconds (a trial is lost after that long without a beat)")
    return Search(metric=metric, direction=direction, trials=trials, sampler=values["sampler"],
                  pruner=values["pruner"], seed=values["seed"], space=dimensions,
                  study=values["study"] or default_study, pruner_startup_trials=values["pruner_startup_trials"],
                  pruner_warmup_steps=values["pruner_warmup_steps"],
                  heartbeat_interval=values["heartbeat_interval"], grace_period=grace, max_retry=values["max_retry"],
                  plots=values["plots"])


def _dimension(field: str, spec: Any, base: Config) -> Dimension:
    where = f"tune.space {field!r}"
    section, dot, name = field.partition(".")
    if section not in SECTIONS or not dot or not name:
        raise ConfigError(f"{where}: unknown field {field}: name a config field as \"section.field\" (sections "
                          f"{', '.join(SECTIONS)}), e.g. \"train.learning_rate\"")
    hint: Any = None
    if section == "task":
        if name == "name":
            raise ConfigError(f"{where}: task.name is the task itself: search one task per tune")
    else:
        hints = typing.get_type_hints(typing.get_type_hints(Config)[section])
        if name not in hints:
            raise ConfigError(f"{where}: unknown config field {field}: [{section}] has {', '.join(hints)}")
        if (section, name) in config_lib.OUTPUT_FIELDS:
            raise ConfigError(f"{where}: {field} changes where or how often a run writes, not what it computes: "
                              "search a field that changes the result")
        hint = hints[name]
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in DISTRIBUTIONS:
        raise ConfigError(f"{where} = {spec!r} is not allowed: use one distribution, "
                          f"{{log_uniform = [a, b]}}, {{uniform = [a, b]}}, {{int = [a, b]}} or {{choice = [...]}}")
    kind, given = next(iter(spec.items()))
    if not isinstance(given, list) or not given:
        raise ConfigError(f"{where}: {kind} = {given!r} is not allowed: use a list")
    if kind == "choice":
        scalar = (str, int, float, bool)
        if not all(isinstance(value, scalar) for value in given) or len({json.dumps(v) for v in given}) < len(given):
            raise ConfigError(f"{where}: choice = {given!r} is not allowed: use distinct numbers, strings or booleans")
        checked = given
    else:
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in given)
        if len(given) != 2 or not numbers or not given[0] < given[1]:
            raise ConfigError(f"{where}: {kind} = {given!r} is not allowed: use [low, high] with low < high")
        if kind == "int" and not all(isinstance(v, int) for v in given):
            raise ConfigError(f"{where}: int = {given!r} is not allowed: use two integers")
        if kind == "log_uniform" and given[0] <= 0:
            raise ConfigError(f"{where}: log_uniform = {given!r} is not allowed: a log scale needs low > 0")
        checked = given
    if hint is not None:
        _check_type(where, field, kind, hint)
    for value in checked:
        _check_value(where, base, field, value)
    return Dimension(field, kind, tuple(checked))


def _check_type(where: str, field: str, kind: str, hint: Any) -> None:
    """The distribution fits the field's type: a float field takes any, an int field int and choice, any other
    (a bool, a string, a list, a table) choice alone."""
    if hint is float or kind == "choice":
        return
    if hint is int:
        if kind != "int":
            raise ConfigError(f"{where}: {field} is an integer field: use {{int = [a, b]}} or {{choice = [...]}}, "
                              f"not {kind}")
        return
    shown = {bool: "true or false", str: "a string"}.get(hint, "a list or table")
    raise ConfigError(f"{where}: {field} takes {shown}: use {{choice = [...]}}, not {kind}")


def _check_value(where: str, base: Config, field: str, value: Any) -> None:
    """`value` is one the config takes in `field` (its own check, e.g. train.learning_rate > 0)."""
    try:
        changed = base.override({field: value})
        if field.startswith("task."):
            tasks.options(tasks.get(changed.task.name), changed.task.options)
    except ConfigError as error:
        raise ConfigError(f"{where}: the value {value!r} is refused: {error}") from None


def check_metric(plan: Search, task: tasks.Task, base: Config) -> None:
    """tune.metric is one the task reports for `base` (`Task.metric_names`), and for each value of a `choice` of a
    task or data field in the space: one ConfigError line naming what it does report, before any study or trial. A
    task that cannot say (None) is checked at the first evaluation instead (`trials.reported_metric`)."""
    variants: list[tuple[str, Config]] = [("", base)]
    for dim in plan.space:
        if dim.kind == "choice" and dim.field.partition(".")[0] in ("task", "data"):
            variants += [(f" with {dim.field} = {value!r}", base.override({dim.field: value})) for value in dim.values]
    for where, config in variants:
        reported = task.metric_names(config, tasks.options(task, config.task.options))
        if reported is None:
            continue
        listing = ", ".join(f"{split}.{name}" for split, names in reported.items() for name in names)
        names = reported.get(plan.split)
        if names is None:
            example = next((f"{split}.{plan.name if _reports(found, plan.name) else found[0]}"
                            for split, found in reported.items() if found), None)
            raise ConfigError(f"tune.metric = {plan.metric!r} names no evaluation split of the run{where}: its "
                              f"evaluation splits are {', '.join(reported) or 'none'}"
                              + (f": use e.g. {example!r}" if example else ""))
        if not _reports(names, plan.name):
            raise ConfigError(f"tune.metric = {plan.metric!r} is not reported by the {task.name} task{where}: its "
                              f"evaluations report {listing}: name one of them")


def _reports(names: Sequence[str], name: str) -> bool:
    """Whether `name` is one of `names` (or matches one of their patterns, `*/f1`)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in names)


"""`tpuplex tune`: hyperparameter search, with Optuna as the engine (its samplers, pruners and storage).

    tpuplex tune CONFIG --backend B [--storage URL] [--trials N] [--output DIR] [--set ...] [--data-dir DIR]

The search is the config's `[tune]` table (docs/tune.md); `tpuplex train` ignores that table, and it never enters a
run's config hash:

    [tune]
    metric = "dev.accuracy"     <eval split>.<metric> of the task's evaluations (`Task.metric_names`, checked first)
    direction = "maximize"      or "minimize" (the default for a loss or an error rate)
    trials = 20                 trials in all, over every worker of the study (grid: its points by default)
    sampler = "tpe"             "random", or "grid" (every point of the choice and int dimensions)
    pruner = "median"           "hyperband", "successive_halving" or "none"
    seed = 0                    the sampler's draws (each trial's from this seed and its number)
    [tune.space]
    "train.learning_rate" = {log_uniform = [1e-5, 1e-3]}
    "train.warmup_ratio" = {uniform = [0.0, 0.2]}
    "train.epochs" = {int = [2, 4]}
    "train.global_batch" = {choice = [16, 32]}

Every trial is an ordinary run, trained in this process (`tpuplex.commands.run.train`) into `<output>/trial-<n>/`
with the trial's values applied to the config, so eval, predict, export and report work on it. Each evaluation
reports the metric to the study (`Trainer.on_evaluation`) and the pruner may stop the trial there (PRUNED).

The study lives in `--storage`: by default an SQLite file in the tune folder (one machine, nothing to start); any
SQLAlchemy URL (`postgresql://user@host/db`) lets any number of workers on any number of hosts run the same command
against one study, each taking the next trial. A trial slot is taken by creating the trial, and a trial numbered
beyond the N first is given back unrun (recorded as failed, marked `tpuplex.surplus`, and left out of every count
and report), so exactly N trials run however many workers race. Each running trial beats a heartbeat into the
storage; one whose worker died (SIGKILL, a lost host) is failed by the next worker after `grace_period` seconds and
queued again (Optuna's RetryHeartbeatStaleTrialCallback) with the same values, and the worker that takes it resumes
the same run folder from its last checkpoint. A trial stopped by SIGTERM / Ctrl-C checkpoints, is queued again the
same way, and the command exits with 75. A worker whose trials are all started waits for those still running, so
that a lost one is retried rather than dropped.

    <output>/study.db       the default storage
    <output>/trial-<n>/     each trial's run folder (n: the trial's number; a retry keeps its trial's folder)
    <output>/tune.json      every trial: state, values, metric, steps, wall seconds, attempts; the best
    <output>/tune.md        the same as a Markdown table
    <output>/best.toml      the config with the best trial's values (no [tune]), for `tpuplex train` as it is
    <output>/*.png          Optuna's plots (optimization history, parameter importances, parallel coordinates),
                            when matplotlib is installed
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import os
import re
import shutil
import socket
import time
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tpuplex import config as config_lib
from tpuplex import hosts, tasks
from tpuplex.commands import run as run_lib
from tpuplex.config import Config, Overrides
from tpuplex.engine.preemption import Preempted
from tpuplex.errors import ConfigError, TpuplexError

TUNE_FILE = "tune.json"
TUNE_MARKDOWN = "tune.md"
BEST_FILE = "best.toml"
BEST_RUN = "best"
STUDY_FILE = "study.db"
TRIAL_PREFIX = "trial-"
PLOTS = {"history.png": "plot_optimization_history", "importances.png": "plot_param_importances",
         "parallel.png": "plot_parallel_coordinate"}
TUNE_FORMAT = "tpuplex.tune/1"
SPEC_ATTR = "tpuplex.search"
SURPLUS_ATTR = "tpuplex.surplus"
REFUSED_ATTR = "tpuplex.refused"
INSTALL = "pip install 'tpuplex-core[tune]'"

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


@dataclasses.dataclass
class Tuned:
    """What `tune` returns (what tune.json holds, and where)."""

    folder: Path
    summary: dict[str, Any]

    @property
    def best(self) -> dict[str, Any] | None:
        """The best complete trial: {"trial", "value", "params", "folder"}; None when no trial completed."""
        return self.summary["best"]

    @property
    def best_config(self) -> Path | None:
        """best.toml: the config with the best trial's values, for `tpuplex train` as it is."""
        return self.folder / BEST_FILE if self.summary["best"] else None

    @property
    def trials(self) -> list[dict[str, Any]]:
        return self.summary["trials"]


def tune(config: Config | str | Path, backend: str, *, search: Mapping[str, Any] | None = None,
         storage: str | None = None, trials: int | None = None, output: str | Path | None = None,
         data_dir: str | Path | None = None, overrides: Overrides = ()) -> Tuned:
    """Run this worker's share of the study (see the module doc) and return what tune.json holds.

    `config`: a TOML file (its [tune] table is the search, `search` laid over it) or a Config (then `search` is
    the whole [tune] table). `storage`: an SQLAlchemy URL shared by the workers (default: SQLite in the tune folder).
    `trials`: replaces tune.trials. `output`: the tune folder (default: the config's runtime.output_dir)."""
    config_path = None
    if isinstance(config, Config):
        base = config.override(overrides) if overrides else config
        base = base if data_dir is None else base.override({"data.data_dir": str(data_dir)})
        table: dict[str, Any] = {}
    else:
        config_path = Path(config)
        base = config_lib.load(config_path, overrides, data_dir)
        table = config_lib.command_table(config_path, "tune", overrides)
    table = {**table, **(search or {})}
    if trials is not None:
        table["trials"] = trials
    task = tasks.get(base.task.name)
    tasks.options(task, base.task.options)
    root = Path(output).expanduser() if output is not None else run_lib.output_directory(base, backend)
    plan = parse_search(table, base, default_study=root.resolve().name)
    check_metric(plan, task, base)
    if hosts.expected_processes() > 1:
        raise TpuplexError("tpuplex tune trains each trial in its one process, not under tpuplex launch: start one "
                           "tpuplex tune per host against one --storage instead")
    run_lib.check_writable_folder(root, "--output")
    foreign = "" if (root / STUDY_FILE).is_file() else run_lib.foreign_files(root, TUNE_FILE)
    if foreign:
        raise TpuplexError(f"--output {str(root)!r} holds files tpuplex tune did not write ({foreign}): give a new or "
                           "empty folder (or the folder of a tune, to go on with it)")
    optuna = _optuna()
    url = storage or f"sqlite:///{(root / STUDY_FILE).resolve()}"
    worker = _Worker(optuna, plan, base, backend, config_path, root, url, external=storage is not None)
    return worker.run()


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise TpuplexError(f"tpuplex tune needs Optuna: {INSTALL}") from None
    return optuna


# -- the [tune] table ----------------------------------------------------------------------------------------


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
    task that cannot say (None) is checked at the first evaluation instead (`_metric`)."""
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


# -- the worker --------------------------------------------------------------------------------------------------


class _Surplus(Exception):
    """A trial numbered beyond the study's N: given back unrun."""


class _Refused(Exception):
    """Bad input found by a trial (a metric the task does not report): the command stops with it."""

    def __init__(self, error: TpuplexError):
        super().__init__(str(error))
        self.error = error


@dataclasses.dataclass
class _Logical:
    """A trial of the study as the user counts it: the first attempt and its retries (each an Optuna trial)."""

    number: int
    attempts: list[Any]

    @property
    def last(self) -> Any:
        return self.attempts[-1]


class _Worker:
    """One `tpuplex tune` process: takes trials until the study has its N, then waits for those still running."""

    def __init__(self, optuna: Any, plan: Search, base: Config, backend: str, config_path: Path | None, root: Path,
                 url: str, external: bool):
        self.optuna, self.plan, self.base, self.backend = optuna, plan, base, backend
        self.config_path, self.root, self.url, self.external = config_path, root, url, external
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self.current: Any = None
        self.said_waiting = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self.retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=plan.max_retry,
                                                                          inherit_intermediate_values=True)

    # -- setting up ----------------------------------------------------------------------------------------

    def run(self) -> Tuned:
        optuna = self.optuna
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.ERROR)  # this command says what happens, one line a trial
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                if not self.external:
                    self.root.mkdir(parents=True, exist_ok=True)  # SQLite's file goes there
                storage = self._storage()
                study = self._study(storage)
                self.root.mkdir(parents=True, exist_ok=True)
                self._write(study)
                self._loop(study)
                return self._write(study, plots=self.plan.plots)
        finally:
            optuna.logging.set_verbosity(verbosity)

    def _storage(self) -> Any:
        """The RDB storage with heartbeats, reached before anything is written to it."""
        import sqlalchemy
        from sqlalchemy.engine import make_url

        url = self.url
        try:
            parsed = make_url(url)
        except sqlalchemy.exc.ArgumentError:
            raise TpuplexError(f"--storage {url!r} is not a database URL: use e.g. postgresql://user@host/db or "
                               "sqlite:///path/study.db") from None
        if parsed.drivername in ("postgresql", "postgres") and not _importable("psycopg2") and _importable("psycopg"):
            parsed = parsed.set(drivername="postgresql+psycopg")  # psycopg 3, what the [tune] extra installs
        shown = parsed.render_as_string(hide_password=True)
        self.shown_url = shown
        arguments = ({"connect_args": {"timeout": 60}} if parsed.get_backend_name() == "sqlite"
                     else {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
                     if parsed.get_backend_name() == "postgresql" else {})
        try:
            engine = sqlalchemy.create_engine(parsed, **arguments)
            with engine.connect():
                pass
            engine.dispose()
        except (sqlalchemy.exc.SQLAlchemyError, ImportError, OSError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise TpuplexError(f"--storage {shown} cannot be reached ({first}): start the database or fix the URL "
                               "(nothing was written to it)") from None
        for attempt in range(1, 6):
            try:
                return self.optuna.storages.RDBStorage(
                    parsed.render_as_string(hide_password=False), engine_kwargs=arguments,
                    heartbeat_interval=self.plan.heartbeat_interval, grace_period=self.plan.grace_period,
                    heartbeat_stale_trial_callback=self.retry)
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
                # Workers that start together on a new database race to create Optuna's tables: the losers find
                # them made on their next try.
                if attempt == 5:
                    raise
                time.sleep(0.5 * attempt)
            except sqlalchemy.exc.SQLAlchemyError as error:
                first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                raise TpuplexError(f"--storage {shown} cannot hold an Optuna study ({first})") from None
        raise AssertionError("unreachable")

    def _study(self, storage: Any) -> Any:
        """The study, created by the first worker, loaded by the others; one made for another search is refused."""
        optuna, plan = self.optuna, self.plan
        study = optuna.create_study(storage=storage, study_name=plan.study, direction=plan.direction,
                                    sampler=self._sampler(), pruner=self._pruner(), load_if_exists=True)
        wanted = json.loads(json.dumps(plan.fingerprint(self.base.hash_with_length(), self.backend)))
        recorded = study.user_attrs.get(SPEC_ATTR)
        counted = [t for t in study.get_trials(deepcopy=False) if not _left_out(t)]
        if recorded is not None and recorded != wanted and counted:
            differs = [key for key in wanted if recorded.get(key) != wanted[key]]
            what = {"space": "another space", "metric": "another metric", "direction": "another direction",
                    "config_hash": "another config (hash {})".format(recorded.get("config_hash")),
                    "backend": f"another backend ({recorded.get('backend')})"}[differs[0]]
            raise TpuplexError(f"study {plan.study!r} in {self.shown_url} was created with {what}: give this search "
                               "another tune.study or --output, or restore the one it was made with")
        if recorded != wanted:
            study.set_user_attr(SPEC_ATTR, wanted)
        if study.direction.name.lower() != plan.direction:
            raise TpuplexError(f"study {plan.study!r} in {self.shown_url} was created to {study.direction.name.lower()}"
                               ": give this search another tune.study or --output")
        return study

    def _sampler(self) -> Any:
        optuna, plan = self.optuna, self.plan

        def make(seed: int) -> Any:
            if plan.sampler == "random":
                return optuna.samplers.RandomSampler(seed=seed)
            if plan.sampler == "grid":
                return optuna.samplers.GridSampler({dim.field: dim.grid() for dim in plan.space}, seed=seed)
            return optuna.samplers.TPESampler(seed=seed)

        return _trial_seeded(optuna, make, plan.seed)

    def _pruner(self) -> Any:
        pruners, plan = self.optuna.pruners, self.plan
        if plan.pruner == "median":
            return pruners.MedianPruner(n_startup_trials=plan.pruner_startup_trials,
                                        n_warmup_steps=plan.pruner_warmup_steps)
        if plan.pruner == "hyperband":
            return pruners.HyperbandPruner()
        if plan.pruner == "successive_halving":
            return pruners.SuccessiveHalvingPruner()
        return pruners.NopPruner()

    # -- taking trials ----------------------------------------------------------------------------------------

    def _loop(self, study: Any) -> None:
        optuna = self.optuna
        while True:
            logical = _logical_trials(study, self.plan.trials)
            finished = [t for t in logical if t.last.state.is_finished()]
            waiting = any(t.last.state == optuna.trial.TrialState.WAITING for t in logical)
            if len(finished) == self.plan.trials:
                return
            if len(logical) < self.plan.trials or waiting:
                self._one_trial(study)
                continue
            if not self.said_waiting:
                running = self.plan.trials - len(finished)
                print(f"tune: all {self.plan.trials} trials have started; waiting for the {running} still running "
                      f"(a lost one is taken again {self.plan.grace_period} s after its last heartbeat)", flush=True)
                self.said_waiting = True
            optuna.storages.fail_stale_trials(study)  # a lost worker's trial is queued again, taken above
            time.sleep(min(self.plan.heartbeat_interval, 5))

    def _one_trial(self, study: Any) -> None:
        self.current = None
        try:
            study.optimize(self._objective, n_trials=1, catch=(TpuplexError, _Surplus), callbacks=[self._finished])
        except _Refused as refused:
            if self.current is not None:  # the refused trial's folder goes: it is not one of the study's trials
                shutil.rmtree(self.root / f"{TRIAL_PREFIX}{self.current.number}", ignore_errors=True)
            raise refused.error from None
        except KeyboardInterrupt as stopped:
            if self.current is not None:
                frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == self.current.number)
                if frozen.state == self.optuna.trial.TrialState.FAIL and not _left_out(frozen):
                    self.retry(study, frozen)  # queued again: the next worker resumes it from its checkpoint
            if isinstance(stopped, Preempted):
                raise stopped.resumed_by("run the same tpuplex tune command again (or another worker takes it) to "
                                         "resume the trial from it") from None
            raise

    def _objective(self, trial: Any) -> float:
        self.current = trial
        trials = trial.study.get_trials(deepcopy=False)
        origin = _origin(next(t for t in trials if t.number == trial.number))
        if origin == trial.number and _rank(trials, trial.number) >= self.plan.trials:
            trial.set_user_attr(SURPLUS_ATTR, True)
            raise _Surplus(f"trial {trial.number} is beyond the study's {self.plan.trials}")
        params = {dim.field: dim.suggest(trial) for dim in self.plan.space}
        folder = self.root / f"{TRIAL_PREFIX}{origin}"
        trial.set_user_attr("folder", str(folder))
        trial.set_user_attr("worker", self.worker)
        config = self.base.override({**params, "runtime.output_dir": str(folder)})
        reports = _Reports(self.optuna, trial, self.plan)
        started = time.perf_counter()
        try:
            results = run_lib.train(config, self.backend, self.config_path, on_evaluation=reports)
        except TpuplexError as error:  # the trial fails (a diverged loss, say); the search goes on
            trial.set_user_attr("error", " ".join(str(error).split()))
            raise
        finally:
            trial.set_user_attr("steps", reports.step)
            trial.set_user_attr("seconds", round(time.perf_counter() - started, 3))
        value = _metric(results["metrics"], self.plan, trial)
        trial.set_user_attr("steps", results["step"])
        return value

    def _finished(self, study: Any, frozen: Any) -> None:
        """One line per finished trial, then tune.json and tune.md."""
        if _left_out(frozen):
            return
        logical = _logical_trials(study, self.plan.trials)
        best = _best(logical, self.plan)
        number = _origin(frozen)
        state = frozen.state.name.lower()
        value = frozen.value if frozen.value is not None else _last_value(frozen)
        shown = f"{self.plan.metric} {value:.6g}" if value is not None else "no value"
        failed = f" ({frozen.user_attrs.get('error', 'see the trial log')})" if state == "fail" else ""
        best_text = (f"best so far {best.last.value:.6g} (trial {best.number})" if best is not None
                     else "no complete trial yet")
        done = sum(t.last.state.is_finished() for t in logical)
        print(f"tune: trial {number} {state}{failed}: {shown} at step {frozen.user_attrs.get('steps', 0)}, "
              f"{_params_text(frozen.params)}, {frozen.user_attrs.get('seconds', 0):.1f} s; {best_text} "
              f"[{done}/{self.plan.trials} done]", flush=True)
        self._write(study)

    # -- outputs ----------------------------------------------------------------------------------------------

    def _write(self, study: Any, plots: bool = False) -> Tuned:
        logical = _logical_trials(study, self.plan.trials)
        best = _best(logical, self.plan)
        rows = [_row(trial) for trial in logical]
        summary = {
            "format": TUNE_FORMAT, "study": self.plan.study, "storage": self.shown_url, "backend": self.backend,
            "config_file": str(self.config_path) if self.config_path else None, "config_hash": self.base.hash(),
            "metric": self.plan.metric, "direction": self.plan.direction, "trials_wanted": self.plan.trials,
            "sampler": self.plan.sampler, "pruner": self.plan.pruner, "seed": self.plan.seed,
            "space": {dim.field: dim.spec() for dim in self.plan.space},
            "counts": {state: sum(row["state"] == state for row in rows)
                       for state in ("complete", "pruned", "fail", "running", "waiting")},
            "best": None, "trials": rows,
        }
        if best is not None:
            best_config = self.base.override({**best.last.params, "runtime.output_dir": str(self.root / BEST_RUN)})
            path = self.root / BEST_FILE
            _write_text(path, _best_toml(best_config, best.number, self.plan, best.last.value))
            summary["best"] = {"trial": best.number, "value": best.last.value, "params": best.last.params,
                               "folder": best.last.user_attrs.get("folder"), "config": str(path)}
        run_lib.write_json_atomic(self.root / TUNE_FILE, summary)
        _write_text(self.root / TUNE_MARKDOWN, markdown(summary) + "\n")
        if plots:
            self._plots(study)
        return Tuned(self.root, summary)

    def _plots(self, study: Any) -> None:
        """Optuna's plots as PNG files, when matplotlib is installed (one line when it is not, or a plot fails)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("tune: no plots (matplotlib is not installed: pip install 'tpuplex-core[report]')", flush=True)
            return
        from optuna.visualization import matplotlib as plots

        complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
        for name, function in PLOTS.items():
            if function != "plot_optimization_history" and len(complete) < 2:
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    axes = getattr(plots, function)(study)
                figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
                figure.savefig(self.root / name, dpi=100, bbox_inches="tight")
                plt.close(figure)
            except Exception as error:  # noqa: BLE001 (a plot is a convenience: say why it is missing, go on)
                print(f"tune: no {name} ({type(error).__name__}: {error})", flush=True)


class _Reports:
    """`Trainer.on_evaluation` of one trial: the metric to the study after each evaluation, then the pruner's word
    (never at the last step: a trial that ran every step is complete)."""

    def __init__(self, optuna: Any, trial: Any, plan: Search):
        self.optuna, self.trial, self.plan = optuna, trial, plan
        self.step = 0

    def __call__(self, step: int, total_steps: int, metrics: dict[str, dict[str, float]]) -> None:
        value = _metric(metrics, self.plan, self.trial)
        self.step = step
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a retried trial reports again a step its first attempt reported
            self.trial.report(value, step)
        if step < total_steps and self.trial.should_prune():
            raise self.optuna.TrialPruned(f"{self.plan.metric} {value:.6g} at step {step}")


def _metric(metrics: dict[str, dict[str, float]], plan: Search, trial: Any) -> float:
    """The searched metric of an evaluation; one the task does not report stops the command (bad input: a task
    whose `metric_names` could not say so before the first trial, or a per-type metric of a type the data lacks)."""
    value = metrics.get(plan.split, {}).get(plan.name)
    if value is None:
        reported = ", ".join(f"{split}.{name}" for split, names in metrics.items() for name in names)
        error = ConfigError(f"tune.metric = {plan.metric!r} is not reported by the task: its evaluations report "
                            f"{reported}")
        trial.set_user_attr(REFUSED_ATTR, str(error))
        raise _Refused(error)
    return float(value)


def _trial_seeded(optuna: Any, make: Callable[[int], Any], seed: int) -> Any:
    """A sampler that is `make(seed')` anew for each trial, seed' drawn from `seed` and the trial's number: one
    worker's search is repeated exactly, and workers that start together draw different values."""

    class TrialSeeded(optuna.samplers.BaseSampler):
        def __init__(self) -> None:
            self._inner = make(seed)

        def before_trial(self, study: Any, trial: Any) -> None:
            # Hashed (numpy's SeedSequence): Mersenne Twisters seeded with nearby integers draw alike at first.
            self._inner = make(int(np.random.SeedSequence([seed, trial.number]).generate_state(1)[0]))
            self._inner.before_trial(study, trial)

        def infer_relative_search_space(self, study: Any, trial: Any) -> Any:
            return self._inner.infer_relative_search_space(study, trial)

        def sample_relative(self, study: Any, trial: Any, search_space: Any) -> Any:
            return self._inner.sample_relative(study, trial, search_space)

        def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
            return self._inner.sample_independent(study, trial, name, distribution)

        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            self._inner.after_trial(study, trial, state, values)

    return TrialSeeded()


# -- reading the study ---------------------------------------------------------------------------------------------


def _origin(trial: Any) -> int:
    """The number of the trial `trial` (a FrozenTrial) is an attempt of (its own, unless it is a retry)."""
    return trial.system_attrs.get("failed_trial", trial.number)


def _left_out(trial: Any) -> bool:
    """A trial given back unrun (surplus), or stopped by bad input: not one of the study's trials."""
    return bool(trial.user_attrs.get(SURPLUS_ATTR) or trial.user_attrs.get(REFUSED_ATTR))


def _rank(trials: Sequence[Any], number: int) -> int:
    """How many of the study's first attempts come before trial `number`."""
    return sum(1 for t in trials if t.number < number and "failed_trial" not in t.system_attrs and not _left_out(t))


def _logical_trials(study: Any, wanted: int) -> list[_Logical]:
    """The study's trials as the user counts them (the first `wanted`), each with its attempts in order."""
    grouped: dict[int, list[Any]] = {}
    for trial in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if not _left_out(trial):
            grouped.setdefault(_origin(trial), []).append(trial)
    return [_Logical(number, attempts) for number, attempts in sorted(grouped.items())][:wanted]


def _best(logical: Sequence[_Logical], plan: Search) -> _Logical | None:
    complete = [t for t in logical if t.last.state.name == "COMPLETE" and t.last.value is not None]
    if not complete:
        return None
    if plan.direction == "maximize":
        return max(complete, key=lambda t: (t.last.value, -t.number))  # a tie: the earlier trial
    return min(complete, key=lambda t: (t.last.value, t.number))


def _last_value(trial: Any) -> float | None:
    values = trial.intermediate_values
    return values[max(values)] if values else None


def _row(logical: _Logical) -> dict[str, Any]:
    last = logical.last
    seconds = [a.user_attrs.get("seconds") for a in logical.attempts if a.user_attrs.get("seconds") is not None]
    return {"trial": logical.number, "state": last.state.name.lower(),
            "value": last.value if last.value is not None else _last_value(last),
            "params": last.params, "steps": last.user_attrs.get("steps"),
            "seconds": round(sum(seconds), 3) if seconds else None,
            "folder": last.user_attrs.get("folder"), "attempts": [a.number for a in logical.attempts],
            "workers": [a.user_attrs.get("worker") for a in logical.attempts]}


def _params_text(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
                     for name, value in params.items())


def markdown(summary: Mapping[str, Any]) -> str:
    """tune.md: one row per trial (state, the metric, steps, wall seconds, its values), the best marked."""
    fields = list(summary["space"])
    best = summary["best"]["trial"] if summary["best"] else None
    counts = ", ".join(f"{count} {state}" for state, count in summary["counts"].items() if count)
    lines = [f"# tpuplex tune: study {summary['study']} ({summary['backend']})", "",
             f"{len(summary['trials'])} of {summary['trials_wanted']} trials ({counts or 'none yet'}); "
             f"{summary['direction']} {summary['metric']}; sampler {summary['sampler']}, pruner {summary['pruner']}.",
             ""]
    if summary["best"]:
        lines += [f"Best: trial {best}, {summary['metric']} = {summary['best']['value']:.6g} "
                  f"({_params_text(summary['best']['params'])}); config: {BEST_FILE}", ""]
    lines += ["| trial | state | " + summary["metric"] + " | steps | seconds | " + " | ".join(fields) + " |",
              "|---|---|---|---|---|" + "---|" * len(fields)]
    for row in summary["trials"]:
        value = f"{row['value']:.6g}" if row["value"] is not None else "-"
        params = [f"{row['params'][f]:.4g}" if isinstance(row["params"].get(f), float)
                  else str(row["params"].get(f, "-")) for f in fields]
        mark = " (best)" if row["trial"] == best else ""
        retried = f" ({len(row['attempts'])} attempts)" if len(row["attempts"]) > 1 else ""
        lines.append(f"| {row['trial']}{mark} | {row['state']}{retried} | {value} | {row['steps'] or 0} | "
                     f"{row['seconds'] or 0:.1f} | " + " | ".join(params) + " |")
    return "\n".join(lines)


# -- best.toml ---------------------------------------------------------------------------------------------------


def _best_toml(config: Config, trial: int, plan: Search, value: float) -> str:
    header = (f"# The best trial of tpuplex tune study {plan.study!r}: trial {trial}, {plan.metric} = {value!r}.\n"
              f"# Its values: {_params_text({d.field: config_value(config, d.field) for d in plan.space})}.\n"
              "# tpuplex train runs it as it is (into runtime.output_dir below).\n\n")
    text = header + toml_text(config.to_dict())
    if config_lib.from_dict(_toml_loads(text)).hash() != config.hash():
        raise RuntimeError("best.toml does not read back as the best trial's config")  # a bug of toml_text
    return text


def config_value(config: Config, field: str) -> Any:
    section, _, name = field.partition(".")
    return config.to_dict()[section].get(name)


def _toml_loads(text: str) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(text)


def toml_text(sections: Mapping[str, Mapping[str, Any]]) -> str:
    """Config sections as TOML (tables inline), which `tomllib` reads back as the same values."""
    lines = []
    for section, fields in sections.items():
        lines.append(f"[{_toml_key(section)}]")
        lines.extend(f"{_toml_key(name)} = {_toml_value(value)}" for name, value in fields.items())
        lines.append("")
    return "\n".join(lines)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else
                                                         "inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML value for {type(value).__name__} {value!r}")


def _write_text(path: Path, text: str) -> None:
    from tpuplex.text_files import staged_text

    with staged_text(path) as file:
        file.write(text)


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def summary_lines(tuned: Tuned) -> list[str]:
    """What the command prints at the end."""
    summary = tuned.summary
    counts = ", ".join(f"{count} {state}" for state, count in summary["counts"].items() if count)
    lines = [f"tune: {len(summary['trials'])} trials ({counts}) in study {summary['study']}"]
    best = summary["best"]
    if best:
        lines.append(f"best: trial {best['trial']}, {summary['metric']} {best['value']:.6g} "
                     f"({_params_text(best['params'])})")
        lines.append(f"best config: {best['config']} (tpuplex train {best['config']} --backend "
                     f"{summary['backend']})")
    lines.append(f"results: {tuned.folder / TUNE_FILE}, {tuned.folder / TUNE_MARKDOWN}")
    return lines



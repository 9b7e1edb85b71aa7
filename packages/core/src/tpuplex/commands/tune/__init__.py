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

The tune folder is marked as tune's by its tune.json (`summary.TUNE_FORMAT`), written before anything else: a folder
without that mark and not empty is refused before anything is written, whatever its files are named.

    search.py     the [tune] table checked against the config, the metric against what the task reports
    storage.py    Optuna: the storage reached first, the study created or loaded, its sampler and pruner
    trials.py     the worker: takes trials, trains each as a run, reports each evaluation to the pruner
    summary.py    what the study holds as the user counts it; tune.json, tune.md, best.toml, the plots
"""

from __future__ import annotations

import os
import reprlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tpuplex import config as config_lib
from tpuplex import hosts, registry, tasks
from tpuplex.commands import run as run_lib
from tpuplex.commands.tune.search import Search, check_metric, parse_search
from tpuplex.commands.tune.storage import import_optuna, reach
from tpuplex.commands.tune.summary import STUDY_FILE, Tuned, is_tune_folder, summary_lines
from tpuplex.commands.tune.trials import Worker
from tpuplex.config import Config, Overrides
from tpuplex.errors import ConfigError, TpuplexError

__all__ = ["Tuned", "summary_lines", "tune"]


def tune(config: Config | str | Path, backend: str, *, search: Mapping[str, Any] | None = None,
         storage: str | None = None, trials: int | None = None, output: str | Path | None = None,
         data_dir: str | Path | None = None, overrides: Overrides = ()) -> Tuned:
    """Run this worker's share of the study (see the module doc) and return what tune.json holds.

    `config`: a TOML file (its [tune] table is the search, `search` laid over it) or a Config (then `search` is
    the whole [tune] table). `storage`: an SQLAlchemy URL shared by the workers (default: SQLite in the tune folder).
    `trials`: replaces tune.trials. `output`: the tune folder (default: the config's runtime.output_dir). Every
    argument, the search, the config's data and the tune folder are checked before anything is written."""
    _check_arguments(config, backend, search, storage, trials, output, data_dir, overrides)
    registry.check_known(backend)
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
    base = _absolute_paths(base)
    task = tasks.get(base.task.name)
    tasks.options(task, base.task.options)
    root = Path(os.path.abspath(Path(output).expanduser() if output is not None
                                else run_lib.output_directory(base, backend)))
    plan = parse_search(table, base, default_study=root.resolve().name)
    check_metric(plan, task, base)
    if hosts.expected_processes() > 1:
        raise TpuplexError("tpuplex tune trains each trial in its one process, not under tpuplex launch: start one "
                           "tpuplex tune per host against one --storage instead")
    field = "--output" if output is not None else "runtime.output_dir"
    run_lib.check_writable_folder(root, field)
    if root.is_dir() and not is_tune_folder(root):
        foreign = run_lib.shown_names(sorted(child.name for child in root.iterdir()))
        if foreign:
            raise TpuplexError(f"{field} {str(root)!r} holds files tpuplex tune did not write ({foreign}): give a "
                               "new or empty folder (or the folder of a tune, to go on with it)")
    optuna = import_optuna()
    if storage is not None:  # reached before the data is prepared (SQLite's file is made in the tune folder later)
        reach(storage)
    _check_inputs(plan, base, config_path)
    url = storage or f"sqlite:///{root / STUDY_FILE}"
    return Worker(optuna, plan, base, backend, config_path, root, url, external=storage is not None).run()


def _check_arguments(config: Any, backend: Any, search: Any, storage: Any, trials: Any, output: Any, data_dir: Any,
                     overrides: Any) -> None:
    """Each argument of `tune` is of a type it takes: one ConfigError line naming it, not a TypeError later."""
    path = str | os.PathLike
    expected = (("config", config, Config | path, "a Config or the path of a TOML config"),
                ("backend", backend, str, 'the name of a backend, e.g. "torch"'),
                ("search", search, Mapping | None, 'a dict of [tune] fields, e.g. {"trials": 3}'),
                ("storage", storage, str | None, 'an SQLAlchemy URL, e.g. "postgresql://user@host/db"'),
                ("output", output, path | None, "the path of the tune folder (a str or Path)"),
                ("data_dir", data_dir, path | None, "the path of the data folder (a str or Path)"),
                ("overrides", overrides, Mapping | Sequence, 'a dict {"section.field": value} or a list of '
                 '"section.field=value" strings'))
    for name, value, kinds, what in expected:
        if not isinstance(value, kinds):
            raise ConfigError(f"tpuplex.tune's {name} takes {what}, not {type(value).__name__} "
                              f"{reprlib.repr(value)}")
    if not isinstance(overrides, str | Mapping) and not all(isinstance(item, str) for item in overrides):
        raise ConfigError(f"tpuplex.tune's overrides takes \"section.field=value\" strings or a dict, not "
                          f"{reprlib.repr(overrides)}")
    if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int)):
        raise ConfigError(f"tpuplex.tune's trials takes a number of trials (an int), not {type(trials).__name__} "
                          f"{reprlib.repr(trials)}")


def _absolute_paths(config: Config) -> Config:
    """`config` with the relative paths it reads from the working directory (data.data_dir, train_file, ...,
    model.checkpoint) and its data.cache_dir made absolute: each trial's run.json and best.toml then name the same
    files from any working directory."""
    raw = config_lib.rebased_inputs(config.to_dict(), Path.cwd())
    raw["data"]["cache_dir"] = os.path.abspath(Path(config.data.cache_dir).expanduser())
    return config_lib.from_dict(raw)


def _check_inputs(plan: Search, base: Config, config_path: Path | None) -> None:
    """What every trial reads is there and reads (the task's data, prepared as the first trial prepares it into
    data.cache_dir; the model's checkpoint), and each `choice` of a task, data or model field in the space is one
    the task and the model kind take (`run.checked_task`): else its one line, before anything else is written. A
    study whose every trial would fail on the same input is that input's error."""
    task, options, kind = run_lib.checked_task(base, config_path)
    kind.check_data(task.prepare(base, options, kind.checkpoint_dir))
    for dim in plan.space:
        if dim.kind == "choice" and dim.field.partition(".")[0] in ("task", "data", "model"):
            for value in dim.values:
                run_lib.checked_task(base.override({dim.field: value}), config_path)

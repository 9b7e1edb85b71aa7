"""What a study holds as the user counts it, and what tune writes of it: tune.json, tune.md, best.toml, the
plots, and the lines the command ends with.

    <output>/tune.json      every trial: state, values, metric, steps, wall seconds, attempts; the best
    <output>/tune.md        the same as a Markdown table
    <output>/best.toml      the config with the best trial's values (no [tune]), for `tpuplex train` as it is
    <output>/*.png          Optuna's plots, when matplotlib is installed
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tpuplex import config as config_lib
from tpuplex.commands import run as run_lib
from tpuplex.commands.tune.search import Search
from tpuplex.config import Config

TUNE_FILE = "tune.json"
TUNE_MARKDOWN = "tune.md"
BEST_FILE = "best.toml"
BEST_RUN = "best"
STUDY_FILE = "study.db"
TRIAL_PREFIX = "trial-"
PLOTS = {"history.png": "plot_optimization_history", "importances.png": "plot_param_importances",
         "parallel.png": "plot_parallel_coordinate"}
TUNE_FORMAT = "tpuplex.tune/1"
SURPLUS_ATTR = "tpuplex.surplus"
REFUSED_ATTR = "tpuplex.refused"
UNSTARTED_ATTR = "tpuplex.unstarted"
"""A failed trial's mark: it failed before its run started (before its run.json), on its config or inputs."""


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


@dataclasses.dataclass(frozen=True)
class Setup:
    """What one worker searches and where: the checked [tune] table, the config it lays each trial's values over,
    the backend, the config file (None for a Config), the tune folder and the storage's URL as shown (no password)."""

    plan: Search
    base: Config
    backend: str
    config_path: Path | None
    root: Path
    shown_url: str


@dataclasses.dataclass
class Logical:
    """A trial of the study as the user counts it: the first attempt and its retries (each an Optuna trial)."""

    number: int
    attempts: list[Any]

    @property
    def last(self) -> Any:
        return self.attempts[-1]


# -- reading the study ---------------------------------------------------------------------------------------------


def origin(trial: Any) -> int:
    """The number of the trial `trial` (a FrozenTrial) is an attempt of (its own, unless it is a retry)."""
    return trial.system_attrs.get("failed_trial", trial.number)


def left_out(trial: Any) -> bool:
    """A trial given back unrun (surplus), or stopped by bad input: not one of the study's trials."""
    return bool(trial.user_attrs.get(SURPLUS_ATTR) or trial.user_attrs.get(REFUSED_ATTR))


def rank(trials: Sequence[Any], number: int) -> int:
    """How many of the study's first attempts come before trial `number`."""
    return sum(1 for t in trials if t.number < number and "failed_trial" not in t.system_attrs and not left_out(t))


def logical_trials(study: Any, wanted: int) -> list[Logical]:
    """The study's trials as the user counts them (the first `wanted`), each with its attempts in order."""
    grouped: dict[int, list[Any]] = {}
    for trial in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if not left_out(trial):
            grouped.setdefault(origin(trial), []).append(trial)
    return [Logical(number, attempts) for number, attempts in sorted(grouped.items())][:wanted]


def best_trial(logical: Sequence[Logical], plan: Search) -> Logical | None:
    complete = [t for t in logical if t.last.state.name == "COMPLETE" and t.last.value is not None]
    if not complete:
        return None
    if plan.direction == "maximize":
        return max(complete, key=lambda t: (t.last.value, -t.number))  # a tie: the earlier trial
    return min(complete, key=lambda t: (t.last.value, t.number))


def last_value(trial: Any) -> float | None:
    values = trial.intermediate_values
    return values[max(values)] if values else None


def _row(logical: Logical) -> dict[str, Any]:
    last = logical.last
    seconds = [a.user_attrs.get("seconds") for a in logical.attempts if a.user_attrs.get("seconds") is not None]
    return {"trial": logical.number, "state": last.state.name.lower(),
            "value": last.value if last.value is not None else last_value(last),
            "params": last.params, "steps": last.user_attrs.get("steps"),
            "seconds": round(sum(seconds), 3) if seconds else None,
            "folder": last.user_attrs.get("folder"), "error": last.user_attrs.get("error"),
            "attempts": [a.number for a in logical.attempts],
            "workers": [a.user_attrs.get("worker") for a in logical.attempts]}


def params_text(params: Mapping[str, Any]) -> str:
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
                  f"({params_text(summary['best']['params'])}); config: {BEST_FILE}", ""]
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



# -- the files ---------------------------------------------------------------------------------------------------


def is_tune_folder(root: Path) -> bool:
    """Whether `root` holds the tune.json of a tpuplex tune (its `format`): the mark of a folder tune may write in."""
    try:
        return json.loads((root / TUNE_FILE).read_text(encoding="utf-8")).get("format") == TUNE_FORMAT
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False


def mark_folder(root: Path) -> None:
    """Make the tune folder and mark it as tune's (a tune.json with no trials yet) before anything else is written
    there (SQLite's study.db), unless it is marked already."""
    root.mkdir(parents=True, exist_ok=True)
    if not is_tune_folder(root):
        run_lib.write_json_atomic(root / TUNE_FILE, {"format": TUNE_FORMAT, "trials": []})


def write(study: Any, setup: Setup, plots: bool = False) -> Tuned:
    """tune.json, tune.md and (once a trial is complete) best.toml, from the study as it is now; the plots too
    when `plots`."""
    plan, root = setup.plan, setup.root
    logical = logical_trials(study, plan.trials)
    best = best_trial(logical, plan)
    rows = [_row(trial) for trial in logical]
    summary = {
        "format": TUNE_FORMAT, "study": plan.study, "storage": setup.shown_url, "backend": setup.backend,
        "config_file": str(setup.config_path) if setup.config_path else None, "config_hash": setup.base.hash(),
        "metric": plan.metric, "direction": plan.direction, "trials_wanted": plan.trials,
        "sampler": plan.sampler, "pruner": plan.pruner, "seed": plan.seed,
        "space": {dim.field: dim.spec() for dim in plan.space},
        "counts": {state: sum(row["state"] == state for row in rows)
                   for state in ("complete", "pruned", "fail", "running", "waiting")},
        "best": None, "trials": rows,
    }
    if best is not None:
        best_config = setup.base.override({**best.last.params, "runtime.output_dir": str(root / BEST_RUN)})
        path = root / BEST_FILE
        _write_text(path, _best_toml(best_config, best.number, plan, best.last.value))
        summary["best"] = {"trial": best.number, "value": best.last.value, "params": best.last.params,
                           "folder": best.last.user_attrs.get("folder"), "config": str(path)}
    run_lib.write_json_atomic(root / TUNE_FILE, summary)
    _write_text(root / TUNE_MARKDOWN, markdown(summary) + "\n")
    if plots:
        _plots(study, root)
    return Tuned(root, summary)


def _plots(study: Any, root: Path) -> None:
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
            figure.savefig(root / name, dpi=100, bbox_inches="tight")
            plt.close(figure)
        except Exception as error:  # noqa: BLE001 (a plot is a convenience: say why it is missing, go on)
            print(f"tune: no {name} ({type(error).__name__}: {error})", flush=True)



# -- best.toml ---------------------------------------------------------------------------------------------------


def _best_toml(config: Config, trial: int, plan: Search, value: float) -> str:
    header = (f"# The best trial of tpuplex tune study {plan.study!r}: trial {trial}, {plan.metric} = {value!r}.\n"
              f"# Its values: {params_text({d.field: config_value(config, d.field) for d in plan.space})}.\n"
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



def summary_lines(tuned: Tuned) -> list[str]:
    """What the command prints at the end (paths under the working directory relative to it)."""
    summary = tuned.summary
    counts = ", ".join(f"{count} {state}" for state, count in summary["counts"].items() if count)
    lines = [f"tune: {len(summary['trials'])} trials ({counts}) in study {summary['study']}"]
    best = summary["best"]
    if best:
        config = _shown(Path(best["config"]))
        lines.append(f"best: trial {best['trial']}, {summary['metric']} {best['value']:.6g} "
                     f"({params_text(best['params'])})")
        lines.append(f"best config: {config} (tpuplex train {config} --backend {summary['backend']})")
    lines.append(f"results: {_shown(tuned.folder / TUNE_FILE)}, {_shown(tuned.folder / TUNE_MARKDOWN)}")
    return lines


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it is under it, else as it is."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)

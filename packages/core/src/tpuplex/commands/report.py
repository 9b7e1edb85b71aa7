"""`tpuplex report RUNS...`: a Markdown table of runs and a figure of their curves, for a README or a paper.

    tpuplex report runs/glue/mrpc-* [--out DIR]
    tpuplex report runs/tune                      a tune folder: its trials (trial-*)

    <DIR>/report.md    one row per run: run, dataset, backend, seed, steps, every final metric, wall time, train
                       and eval examples/s, compiles, config hash (from each run's results.json), then each config
                       field whose value differs between the runs (a tune's sampled values)
    <DIR>/report.png   left: the training loss of every run by step; right: each run's first eval split's first
                       metric by step (from each run's log.jsonl)

A run folder that has no results.json yet (a pruned trial, a run stopped or still running) is left out with one
note line. DIR defaults to the current directory. The figure needs matplotlib (pip install tpuplex-core[report]).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tpuplex import config as config_lib
from tpuplex.commands.run import RESULTS_FILE
from tpuplex.commands.run_folder import RUN_FILE, written_by_a_run
from tpuplex.commands.tune.summary import TRIAL_PREFIX, is_tune_folder
from tpuplex.engine.run_log import LOG_FILE
from tpuplex.errors import TpuplexError

COLUMNS = ("run", "dataset", "backend", "seed", "steps", "metrics", "wall time", "train ex/s", "eval ex/s", "compiles",
           "config hash")


def load_runs(paths: Sequence[str | Path]) -> list[tuple[Path, dict[str, Any]]]:
    """(run folder, results.json) of each path: a run folder, its results.json, or a tune folder (its trials). A
    run that has not finished (no results.json: pruned, stopped or running) is left out, said in one note line."""
    if not paths:
        raise TpuplexError("tpuplex report needs at least one run folder: tpuplex report runs/glue/mrpc-*")
    runs, unfinished = [], []
    for folder in _run_folders(map(Path, paths)):
        if (folder / RESULTS_FILE).is_file():
            runs.append((folder, json.loads((folder / RESULTS_FILE).read_text())))
        elif written_by_a_run(folder / RUN_FILE):
            unfinished.append(folder.name)
        else:
            raise TpuplexError(f"{folder} has no {RESULTS_FILE}: give folders of finished tpuplex train runs")
    if unfinished:
        print(f"tpuplex report: note: {', '.join(unfinished)} left out: no {RESULTS_FILE} (a run that stopped before "
              "its end: a pruned trial, an interrupted or failed run, or one still running)", file=sys.stderr)
    if not runs:
        given = f"none of the runs given has finished ({', '.join(unfinished)})" if unfinished else (
            f"{', '.join(map(str, paths))} holds no run yet")
        raise TpuplexError(f"{given}: tpuplex report needs a run with its {RESULTS_FILE}")
    return runs


def _run_folders(paths: Sequence[Path]) -> list[Path]:
    """The run folders `paths` name: a results.json's folder, a tune folder's trials in their order, a folder."""
    folders = []
    for path in paths:
        if path.name == RESULTS_FILE:
            folders.append(path.parent)
        elif not (path / RESULTS_FILE).exists() and is_tune_folder(path):
            trials = [child for child in path.glob(f"{TRIAL_PREFIX}*") if child.name[len(TRIAL_PREFIX):].isdigit()]
            folders += sorted(trials, key=lambda child: int(child.name[len(TRIAL_PREFIX):]))
        else:
            folders.append(path)
    return folders


def differing_fields(runs: Sequence[tuple[Path, dict[str, Any]]]) -> list[str]:
    """The config fields ("section.field") whose value differs between the runs, in config order: what sets them
    apart (a tune's sampled values, a sweep's seed is its own column), less where and how often they write."""
    configs = [_flat(results["config"]) for _, results in runs]
    fields = list(dict.fromkeys(field for config in configs for field in config))
    shown = {".".join(field) for field in config_lib.OUTPUT_FIELDS} | {"train.seed"}
    return [field for field in fields if field not in shown
            and len({json.dumps(config.get(field), sort_keys=True) for config in configs}) > 1]


def _flat(config: dict[str, Any]) -> dict[str, Any]:
    return {f"{section}.{name}": value for section, fields in config.items() for name, value in fields.items()}


def _cell(value: Any) -> str:
    """A config value in a table cell: a float to 4 significant digits, anything else as TOML would write it."""
    if isinstance(value, float):
        return f"{value:.4g}"
    text = value if isinstance(value, str) else json.dumps(value)
    return str(text).replace("|", "/") if value is not None else "-"


def table(runs: Sequence[tuple[Path, dict[str, Any]]]) -> str:
    """The Markdown table (see the module doc); metrics in percent, losses as they are."""
    fields = differing_fields(runs)
    lines = ["| " + " | ".join((*COLUMNS, *fields)) + " |", "|" + "---|" * (len(COLUMNS) + len(fields))]
    for folder, results in runs:
        shown = ", ".join(f"{split} {name} {value if name == 'loss' else 100 * value:.2f}"
                          for split, metrics in results["metrics"].items() for name, value in metrics.items())
        cells = (folder.name, results.get("dataset", results["task"]), results["backend"],
                 str(results["config"]["train"]["seed"]),
                 str(results["step"]), shown, f"{results['wall_seconds'] / 60:.1f} min",
                 f"{results['train']['examples_per_s']:.1f}", f"{results['eval']['examples_per_s']:.1f}",
                 str(results["compile_count"]), results["config_hash"],
                 *(_cell(_flat(results["config"]).get(field)) for field in fields))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def curves(folder: Path) -> tuple[list[tuple[int, float]], str, list[tuple[int, float]]]:
    """(step, training loss) records, the plotted eval metric's name, and its (step, value) records."""
    entries = [json.loads(line) for line in (folder / LOG_FILE).read_text().splitlines() if line.strip()]
    train = [(e["step"], e["loss"]) for e in entries if e["event"] == "train"]
    evals = [e for e in entries if e["event"] == "eval"]
    if not evals:
        return train, "", []
    split = evals[0]["split"]
    skip = {"event", "step", "time", "split", "loss"}
    metric = next((key for key in evals[0] if key not in skip), "loss")
    return train, f"{split} {metric}", [(e["step"], e[metric]) for e in evals if e["split"] == split]


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or one line saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TpuplexError("tpuplex report draws its figure with matplotlib, which is not installed: "
                           "pip install tpuplex-core[report]") from None
    return plt


def figure(runs: Sequence[tuple[Path, dict[str, Any]]], path: Path) -> Path:
    """The PNG of training loss and eval metric curves of every run."""
    plt = pyplot()
    fig, (loss_axes, metric_axes) = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    metric_names = set()
    for folder, results in runs:
        label = f"{folder.name} ({results['backend']})"
        train, metric, evals = curves(folder)
        if train:
            loss_axes.plot(*zip(*train, strict=True), label=label, linewidth=1)
        if evals:
            metric_axes.plot(*zip(*evals, strict=True), marker="o", label=label)
            metric_names.add(metric)
    loss_axes.set(title="training loss", xlabel="step", ylabel="loss")
    metric_axes.set(title=", ".join(sorted(metric_names)) or "evaluation", xlabel="step")
    for axes in (loss_axes, metric_axes):
        axes.grid(alpha=0.3)
    loss_axes.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": SIGNATURE})
    plt.close(fig)
    return path


SIGNATURE = "tpuplex report"
"""report.png's Software entry; report.md is known by its table's header row. A later report may replace what
a report wrote, and no file of anyone else's."""


def report(paths: Sequence[str | Path], out: Path = Path(".")) -> tuple[Path, Path]:
    """Write report.md and report.png for the runs `paths` into `out`; returns both paths."""
    runs = load_runs(paths)
    pyplot()  # before anything is written
    markdown, png = out / "report.md", out / "report.png"
    header = ("| " + " | ".join(COLUMNS) + " |").encode()
    for path, mark in ((markdown, header), (png, SIGNATURE.encode())):
        if path.exists() and not (path.is_file() and mark in path.read_bytes()[:4096]):
            raise TpuplexError(f"{path} exists and tpuplex report did not write it: give --out another folder, so "
                               "it is not replaced")
    out.mkdir(parents=True, exist_ok=True)
    markdown.write_text(table(runs) + "\n")
    return markdown, figure(runs, png)

"""`tpuplex sweep`: one config over several seeds, then mean ± std of every metric.

    tpuplex sweep CONFIG --backend B --seeds 1,2,3,4,5 [--set ...]

Each seed is an ordinary run, `tpuplex train CONFIG --backend B --set train.seed=S --set
runtime.output_dir=<output_dir>/seed-S`, started here one after another in a process of its own (a fresh
framework each time, exactly what a cluster job would run). On a cluster, run those commands as an array job in
parallel, then `tpuplex report <output_dir>/seed-*` gives the same table. A seed that has finished (its
results.json exists) is not run again, so an interrupted sweep continues where it stopped.

    <output_dir>/seed-S/...     each run, as tpuplex train writes it
    <output_dir>/sweep.json     per eval split and metric: mean, std (sample, n - 1), each seed's value
    <output_dir>/sweep.md       the same as a Markdown table
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tpuplex import config as config_lib
from tpuplex import tasks
from tpuplex.commands.run import RESULTS_FILE, output_directory, write_json_atomic
from tpuplex.errors import TpuplexError


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise TpuplexError(f"--seeds {text!r} is not a comma-separated list of integers: e.g. --seeds 1,2,3,4,5"
                           ) from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise TpuplexError(f"--seeds {text!r} must name at least one seed, each once: e.g. --seeds 1,2,3,4,5")
    return seeds


def sweep(config_path: Path, backend: str, seeds: Sequence[int], overrides: Sequence[str] = (),
          data_dir: str | None = None) -> dict[str, Any]:
    """Run every seed (see the module doc) and return what sweep.json holds."""
    base = config_lib.load(config_path, overrides)  # bad input stops here, before any run
    tasks.options(tasks.get(base.task.name), base.task.options)
    root = output_directory(base, backend)
    for name, mark in (("sweep.json", '"seeds"'), ("sweep.md", "| metric | mean ± std |")):
        if (root / name).exists() and mark not in (root / name).read_text(errors="replace"):
            raise TpuplexError(f"{root / name} exists and tpuplex sweep did not write it: set another "
                               "runtime.output_dir, so it is not replaced")
    for seed in seeds:
        config_lib.load(config_path, [*overrides, f"train.seed={seed}"])
    runs = []
    for seed in seeds:
        folder = root / f"seed-{seed}"
        if not (folder / RESULTS_FILE).is_file():
            command = [sys.executable, "-m", "tpuplex", "train", str(config_path), "--backend", backend,
                       *(part for item in overrides for part in ("--set", item)), "--set", f"train.seed={seed}",
                       "--set", f"runtime.output_dir={json.dumps(str(folder))}",
                       *(("--data-dir", data_dir) if data_dir is not None else ())]
            print(f"sweep: seed {seed} -> {folder}", flush=True)
            status = subprocess.run(command, check=False).returncode
            if status != 0:
                raise TpuplexError(f"the run of seed {seed} stopped with exit status {status} (its output is above): "
                                   "fix it and run the same sweep command again; finished seeds are kept")
        runs.append(json.loads((folder / RESULTS_FILE).read_text()))
    summary = summarize(runs)
    root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(root / "sweep.json", summary)
    (root / "sweep.md").write_text(markdown(summary) + "\n")
    return summary


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per eval split and metric, over the runs' results.json: mean, sample std and each seed's value."""
    seeds = [run["config"]["train"]["seed"] for run in runs]
    metrics: dict[str, dict[str, Any]] = {}
    for split, names in runs[0]["metrics"].items():
        for name in names:
            values = np.array([run["metrics"][split][name] for run in runs], np.float64)
            metrics[f"{split} {name}"] = {"mean": float(values.mean()),
                                          "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
                                          "values": values.tolist()}
    first = runs[0]
    return {"task": first.get("dataset", first["task"]), "backend": first["backend"], "seeds": seeds,
            "metrics": metrics,
            "runs": [run["output_dir"] for run in runs]}


def markdown(summary: dict[str, Any]) -> str:
    """The sweep as a Markdown table: one row per metric, mean ± std then each seed (percent, loss as is)."""
    seeds = summary["seeds"]
    lines = [f"{summary['task']} on {summary['backend']}, {len(seeds)} seeds",
             "", "| metric | mean ± std | " + " | ".join(f"seed {s}" for s in seeds) + " |",
             "|---|---|" + "---|" * len(seeds)]
    for name, values in summary["metrics"].items():
        scale = 1.0 if name.endswith(" loss") else 100.0
        cells = [f"{scale * values['mean']:.2f} ± {scale * values['std']:.2f}",
                 *(f"{scale * v:.2f}" for v in values["values"])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

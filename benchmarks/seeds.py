"""Seed loops for the side-by-side benchmarks (`hf_run_ner.py`, `hf_run_mlm.py`): each seed runs every side in
turn, so all see the same machine load; one JSON line per run, then the mean and sample std of each figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def run_tpuplex(config: Path, backend: str, seed: int, run_dir: Path, *overrides: str) -> dict:
    """`tpuplex train config --backend backend` with train.seed = seed, into run_dir; its results.json."""
    sets = [f"train.seed={seed}", f'runtime.output_dir="{run_dir.resolve()}"', *overrides]
    subprocess.run([sys.executable, "-m", "tpuplex", "train", str(config), "--backend", backend,
                    *(part for value in sets for part in ("--set", value))], check=True, cwd=ROOT,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return json.loads((run_dir / "results.json").read_text())


def side_by_side(seeds: list[int], sides: dict[str, Callable[[int], dict]], figures: tuple[str, ...],
                 out: Path) -> dict:
    """Run every side for every seed; print and write (`<out>/summary.json`) the rows and, per side and figure,
    (mean, sample std), with the train tokens/s ratio of the last side to the first."""
    rows = []
    for seed in seeds:
        for run in sides.values():
            rows.append(run(seed))
            print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for name in sides:
        mine = [row for row in rows if row["run"] == name]
        summary[name] = {figure: (round(float(np.mean([r[figure] for r in mine])), 4),
                                  round(float(np.std([r[figure] for r in mine], ddof=1)), 4) if len(mine) > 1 else 0.0)
                         for figure in figures}
    first, last = list(sides)[0], list(sides)[-1]
    if "train_tokens_per_s" in figures:
        summary["tokens_per_s_ratio"] = round(summary[last]["train_tokens_per_s"][0]
                                              / summary[first]["train_tokens_per_s"][0], 3)
    print(json.dumps(summary, indent=1))
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")
    return summary

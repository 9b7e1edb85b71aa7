"""The README's results table, read from the `results.json` files that `tpuplex train` wrote.

    python examples/glue/results_table.py runs/glue/*/results.json

One Markdown row per run: task, backend, every dev metric of the task, steps, wall time, training and evaluation
examples/s, compile count and config hash. Needs only the standard library.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = ("task", "backend", "dev metrics", "steps", "wall time", "train ex/s", "eval ex/s", "compiles",
           "config hash")


def row(results: dict) -> str:
    metrics = next(iter(results["metrics"].values())) if len(results["metrics"]) == 1 else {
        f"{split} {name}": value for split, split_metrics in results["metrics"].items()
        for name, value in split_metrics.items()}
    shown = ", ".join(f"{name} {100 * value:.2f}" for name, value in metrics.items() if name != "loss")
    cells = (results["task"], results["backend"], shown, str(results["step"]),
             f"{results['wall_seconds'] / 60:.1f} min", f"{results['train']['examples_per_s']:.1f}",
             f"{results['eval']['examples_per_s']:.1f}", str(results["compile_count"]), results["config_hash"])
    return "| " + " | ".join(cells) + " |"


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    runs = sorted((json.loads(Path(path).read_text()) for path in paths), key=lambda r: (r["task"], r["backend"]))
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for results in runs:
        print(row(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

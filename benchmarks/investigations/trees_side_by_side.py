"""One `tpuplex train` command on two source trees of tpuplex, alternating, to compare a change's speed.

    git worktree add /tmp/base <commit>
    python benchmarks/investigations/trees_side_by_side.py --trees base=/tmp/base new=. --rounds 3 \
        --backend jax --out runs/trees -- examples/shakespeare_char/cpu.toml --set train.max_steps=300

Each tree's packages run from their source (`PYTHONPATH` = its packages' `src` folders) in the same interpreter;
the config path is taken from each tree, relative to it. Printed per round and tree: results.json's training
examples/s and tokens/s (the timed training steps, compilation and evaluation excluded); then each tree's mean.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PACKAGES = ("core", "tf_backend", "torch_backend", "jax_backend")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", required=True, help="name=folder of a tpuplex checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="jax")
    parser.add_argument("--out", type=Path, default=Path("runs/trees"))
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- config.toml --set ...")
    args = parser.parse_args()
    config, *sets = [arg for arg in args.train_args if arg != "--"]
    trees = dict(tree.split("=", 1) for tree in args.trees)
    rates: dict[str, list[float]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        for name, folder in trees.items():
            root = Path(folder).resolve()
            output = (args.out / f"{name}-{round_}").resolve()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(root / "packages" / p / "src") for p in PACKAGES)}
            command = [sys.executable, "-m", "tpuplex", "train", str(root / config), "--backend", args.backend,
                       *sets, "--set", f'runtime.output_dir="{output}"']
            subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
            train = json.loads((output / "results.json").read_text())["train"]
            rates[name].append(train["examples_per_s"])
            print(f"round {round_} {name}: {train['examples_per_s']:.1f} examples/s, "
                  f"{train['tokens_per_s']:.0f} tokens/s", flush=True)
    for name, values in rates.items():
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{name}: {statistics.mean(values):.1f} +- {spread:.1f} examples/s over {len(values)} rounds")


if __name__ == "__main__":
    main()

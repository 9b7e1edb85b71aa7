"""nanoGPT's character-level Shakespeare: nanoGPT's own `train.py` beside tpuplex, same machine, alternating, seeds.

    python benchmarks/nanogpt_side_by_side.py --nanogpt /path/to/nanoGPT.git --seeds 1337 1338 1339 \
        --backends torch jax tf --python jax=.nox/tests-jax/bin/python tf=.nox/tests-tf/bin/python \
        --out runs/nanogpt-sbs

nanoGPT (karpathy/nanoGPT, a checkout or a bare git folder: its `train.py`, `model.py`, `configurator.py`,
`config/train_shakespeare_char.py` and `data/shakespeare_char/prepare.py` are copied into a work folder) runs its
README's CPU recipe:

    train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20 --log_interval=1
      --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
      --dropout=0.0

on `../shared/text/tinyshakespeare/input.txt` (its prepare.py, given the file, downloads nothing: its unused
`import requests` is dropped). One line of train.py is changed: `torch.manual_seed(1337 + seed_offset)` takes the
seed from NANOGPT_SEED. tpuplex runs
`examples/shakespeare_char/cpu.toml` (the same recipe) with `--set train.seed=SEED` on each backend.

Printed per seed and side: iterations/s of the training steps, by one statistic on both sides (iterations over
the seconds they took, evaluation excluded: nanoGPT's per-iteration times averaged, the evaluating iterations left
out; tpuplex's results.json training examples/s / batch; results.json also keeps the median nanoGPT prints), and the
validation
loss at the last iteration (nanoGPT: its estimate over `eval_iters` = 20 random batches; tpuplex: every held-out
token once). Then each side's mean and sample std, and the ratio of iterations/s to nanoGPT's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INPUT = REPO.parent / "shared" / "text" / "tinyshakespeare" / "input.txt"
CONFIG = REPO / "examples" / "shakespeare_char" / "cpu.toml"
NANOGPT_FILES = ("train.py", "model.py", "configurator.py", "config/train_shakespeare_char.py",
                 "data/shakespeare_char/prepare.py")
CPU_RECIPE = ["--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
              "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--max_iters=2000",
              "--lr_decay_iters=2000", "--dropout=0.0"]
SEED_LINE = "torch.manual_seed(1337 + seed_offset)"


def nanogpt_folder(source: Path, work: Path) -> Path:
    """nanoGPT's files in `work/nanogpt`, with the seed line patched and the Shakespeare data prepared."""
    folder = work / "nanogpt"
    for name in NANOGPT_FILES:
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (source / name).is_file():
            text = (source / name).read_text()
        else:  # a bare git folder (what `fetch` gives)
            text = subprocess.run(["git", "--git-dir", str(source), "show", f"HEAD:{name}"], check=True,
                                  capture_output=True, text=True).stdout
        target.write_text(text)
    train = folder / "train.py"
    patched = train.read_text().replace(SEED_LINE, "torch.manual_seed(int(os.environ['NANOGPT_SEED']) + seed_offset)")
    assert patched != train.read_text(), "nanoGPT's seed line moved: update SEED_LINE"
    train.write_text(patched)
    data = folder / "data" / "shakespeare_char"
    prepare = data / "prepare.py"  # it imports requests only to download input.txt, which is given here
    prepare.write_text(prepare.read_text().replace("import requests\n", ""))
    (data / "input.txt").write_bytes(INPUT.read_bytes())
    subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True)
    return folder


def run_nanogpt(folder: Path, seed: int, iters: int) -> dict[str, float]:
    command = [sys.executable, "train.py", "config/train_shakespeare_char.py", *CPU_RECIPE,
               f"--max_iters={iters}", f"--lr_decay_iters={iters}", f"--out_dir=out-{seed}"]
    started = time.perf_counter()
    output = subprocess.run(command, cwd=folder, check=True, capture_output=True, text=True,
                            env={**os.environ, "NANOGPT_SEED": str(seed)}).stdout
    wall = time.perf_counter() - started
    times = [float(ms) for step, ms in re.findall(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", output, re.M)
             if int(step) > 0 and int(step) % 250]  # iteration 0 and the evaluating iterations excluded
    val = re.findall(rf"^step {iters}: train loss [\d.]+, val loss ([\d.]+)", output, re.M)
    (folder / f"out-{seed}.log").write_text(output)
    return {"iters_per_s": 1000.0 / statistics.mean(times), "median_iters_per_s": 1000.0 / statistics.median(times),
            "val_loss": float(val[-1]), "wall_s": wall}


def run_tpuplex(backend: str, python: str, seed: int, iters: int, out: Path) -> dict[str, float]:
    folder = out / f"tpuplex-{backend}-{seed}"
    command = [python, "-m", "tpuplex", "train", str(CONFIG), "--backend", backend,
               "--set", f"train.seed={seed}", "--set", f"train.max_steps={iters}",
               "--set", f"runtime.output_dir={folder}", "--set", f"runtime.eval_every={iters}"]
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - started
    results = json.loads((folder / "results.json").read_text())
    batch = results["config"]["train"]["global_batch"]
    return {"iters_per_s": results["train"]["examples_per_s"] / batch,
            "val_loss": results["metrics"]["validation"]["loss"], "wall_s": wall}


def summary(rows: list[dict[str, float]], key: str) -> str:
    values = [row[key] for row in rows]
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {spread:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout or bare git folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1337, 1338, 1339])
    parser.add_argument("--backends", nargs="+", default=["torch", "jax", "tf"])
    parser.add_argument("--python", nargs="*", default=[], metavar="BACKEND=PYTHON",
                        help="the interpreter of a backend's environment (default: this one; nanoGPT runs here)")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the runs and results.json")
    args = parser.parse_args()
    pythons = {backend: sys.executable for backend in args.backends} | dict(p.split("=", 1) for p in args.python)
    args.out.mkdir(parents=True, exist_ok=False)
    folder = nanogpt_folder(args.nanogpt, args.out)
    results: dict[str, list[dict[str, float]]] = {"nanogpt": [], **{backend: [] for backend in args.backends}}
    for seed in args.seeds:  # alternating: each seed runs every side before the next seed
        for side in results:
            row = (run_nanogpt(folder, seed, args.iters) if side == "nanogpt"
                   else run_tpuplex(side, pythons[side], seed, args.iters, args.out))
            results[side].append({"seed": seed, **row})
            print(f"seed {seed} {side:8s} {row['iters_per_s']:.2f} it/s, val loss {row['val_loss']:.4f}, "
                  f"wall {row['wall_s']:.0f} s", flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    reference = statistics.mean(row["iters_per_s"] for row in results["nanogpt"])
    print(f"\n{'side':8s}  {'iterations/s':>18s}  {'vs nanoGPT':>10s}  {'val loss at ' + str(args.iters):>20s}")
    for side, rows in results.items():
        ratio = statistics.mean(row["iters_per_s"] for row in rows) / reference
        print(f"{side:8s}  {summary(rows, 'iters_per_s'):>18s}  {ratio:>9.2f}x  {summary(rows, 'val_loss'):>20s}")


if __name__ == "__main__":
    main()

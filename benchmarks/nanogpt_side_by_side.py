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

on `../shared/text/tinyshakespeare/input.txt` (or `--text`; its prepare.py, given the file, downloads nothing: its
unused `import requests` is dropped). Two lines of train.py are changed: `torch.manual_seed(1337 + seed_offset)` takes
the seed from NANOGPT_SEED, and its log line also prints the host clock (below). tpuplex runs
`examples/shakespeare_char/cpu.toml` (the same recipe) with `--set train.seed=SEED` on each backend, its model's
config.json given nanoGPT's vocabulary size (prepare.py's meta.pkl: the text's characters), so that both sides
train one model on any `--text`.

`--recipe gpu` runs nanoGPT's GPU config as it is (`train.py config/train_shakespeare_char.py`: 6
layers, 6 heads, 384 wide, context 256, batch 64, dropout 0.2, bf16, 5,000 iterations, on `cuda`) beside
`examples/shakespeare_char/gpu.toml` (the same recipe; the torch side compiled and replayed as CUDA graphs:
`runtime.torch_mode = "cuda_graphs"`, or `--torch-mode compile` without the graphs).
`--quick` shrinks either recipe to `--iters` steps of a batch of 8 rows of 64 on the CPU, uncompiled: a dry run of
this script on a machine without the GPU.

Printed per seed and side: iterations/s of the training steps, by one statistic on both sides (iterations over
the seconds they took, evaluation excluded). nanoGPT: between consecutive logged iterations, each logged one read
at the host clock just after its `loss.item()` (a second changed line prints it; the loss read waits for the GPU,
so each window holds exactly its iterations' work), the first window (compilation) and every window holding an
evaluation left out; on the GPU it logs every 10th iteration as its config does, because logging every iteration
would make the host wait for each step. tpuplex: the steps of its log.jsonl "train" windows over their summed
`seconds` (evaluation already left out), the first (compilation) left out likewise. results.json also keeps the
median of the per-iteration times nanoGPT prints. And the validation loss at the last iteration and the best of the
evaluations every 250 iterations (the figure nanoGPT's README quotes; nanoGPT: its estimate over `eval_iters`
random batches, 200 on the GPU and 20 on the CPU; tpuplex: every held-out token once). Then each side's mean and
sample std, and the ratio of iterations/s to nanoGPT's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INPUT = REPO.parent / "shared" / "text" / "tinyshakespeare" / "input.txt"
CONFIG = REPO / "examples" / "shakespeare_char" / "cpu.toml"
NANOGPT_FILES = ("train.py", "model.py", "configurator.py", "config/train_shakespeare_char.py",
                 "data/shakespeare_char/prepare.py")
CPU_RECIPE = ["--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
              "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--max_iters=2000",
              "--lr_decay_iters=2000", "--dropout=0.0"]
GPU_RECIPE = ["--compile=True"]
QUICK = {"nanogpt": ["--device=cpu", "--compile=False", "--dtype=float32", "--batch_size=8", "--block_size=64",
                     "--eval_iters=2", "--log_interval=1"],
         "tpuplex": ["train.global_batch=8", "data.max_length=64", "train.bf16=false"]}
SEED_LINE = "torch.manual_seed(1337 + seed_offset)"
LOG_LINE = 'print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%")'


def nanogpt_folder(source: Path, work: Path, shakespeare: Path) -> Path:
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
    patched = train.read_text()
    for line, replacement in ((SEED_LINE, "torch.manual_seed(int(os.environ['NANOGPT_SEED']) + seed_offset)"),
                              (LOG_LINE, LOG_LINE.replace('%")', '%, at {time.time():.6f}")'))):
        assert line in patched, f"nanoGPT's train.py no longer has {line!r}: update this script"
        patched = patched.replace(line, replacement)
    train.write_text(patched)
    data = folder / "data" / "shakespeare_char"
    prepare = data / "prepare.py"  # it imports requests only to download input.txt, which is given here
    prepare.write_text(prepare.read_text().replace("import requests\n", ""))
    (data / "input.txt").write_bytes(shakespeare.read_bytes())
    subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True)
    return folder


def sized_model(config: Path, nanogpt: Path, work: Path) -> Path:
    """The model folder of tpuplex's `config` in `work/tpuplex-model`, with the vocabulary size of nanoGPT's
    prepared text (its meta.pkl)."""
    meta = pickle.loads((nanogpt / "data" / "shakespeare_char" / "meta.pkl").read_bytes())
    source = config.parent / tomllib.loads(config.read_text())["model"]["checkpoint"] / "config.json"
    model = work / "tpuplex-model"
    model.mkdir()
    sized = {**json.loads(source.read_text()), "vocab_size": meta["vocab_size"]}
    (model / "config.json").write_text(json.dumps(sized, indent=2) + "\n")
    return model


def run_nanogpt(folder: Path, seed: int, iters: int, recipe: list[str], eval_interval: int) -> dict[str, float]:
    command = [sys.executable, "train.py", "config/train_shakespeare_char.py", *recipe, f"--max_iters={iters}",
               f"--lr_decay_iters={iters}", f"--eval_interval={eval_interval}", f"--out_dir=out-{seed}"]
    started = time.perf_counter()
    output = subprocess.run(command, cwd=folder, check=True, capture_output=True, text=True,
                            env={**os.environ, "NANOGPT_SEED": str(seed)}).stdout
    wall = time.perf_counter() - started
    logged = [(int(step), float(ms), float(at)) for step, ms, at
              in re.findall(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms, mfu -?[\d.]+%, at ([\d.]+)", output, re.M)]
    windows = [(end - start, end_at - start_at) for (start, _, start_at), (end, _, end_at) in itertools.pairwise(logged)
               if start > 0 and end // eval_interval == start // eval_interval]  # no compilation, no evaluation
    times = [ms for step, ms, _ in logged if step > 0 and step % eval_interval]
    val = {int(step): float(loss) for step, loss
           in re.findall(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)", output, re.M)}
    (folder / f"out-{seed}.log").write_text(output)
    return {"iters_per_s": sum(iters for iters, _ in windows) / sum(seconds for _, seconds in windows),
            "median_iters_per_s": 1000.0 / statistics.median(times),
            "val_loss": val[iters], "best_val_loss": min(val.values()), "wall_s": wall}


def run_tpuplex(backend: str, python: str, seed: int, iters: int, eval_interval: int, out: Path, config: Path,
                text: Path, settings: list[str]) -> dict[str, float]:
    folder = out / f"tpuplex-{backend}-{seed}"
    settings = [f"train.seed={seed}", f"train.max_steps={iters}", f"runtime.output_dir={json.dumps(str(folder))}",
                f"runtime.eval_every={eval_interval}", f"data.train_file={json.dumps(str(text))}", *settings]
    command = [python, "-m", "tpuplex", "train", str(config), "--backend", backend,
               *(part for setting in settings for part in ("--set", setting))]
    started = time.perf_counter()
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode != 0:
        sys.exit(f"tpuplex {backend} exited with {finished.returncode}:\n{finished.stderr[-4000:]}")
    wall = time.perf_counter() - started
    results = json.loads((folder / "results.json").read_text())
    batch = results["config"]["train"]["global_batch"]
    records = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    windows = [(r["step"], r["seconds"]) for r in records if r["event"] == "train"]
    steady = [(step - before, seconds) for (before, _), (step, seconds) in itertools.pairwise(windows)]  # no compile
    evals = [r["loss"] for r in records if r["event"] == "eval" and r["split"] == "validation"]
    return {"iters_per_s": (sum(steps for steps, _ in steady) / sum(seconds for _, seconds in steady)
                            if steady else results["train"]["examples_per_s"] / batch),
            "val_loss": results["metrics"]["validation"]["loss"], "best_val_loss": min(evals), "wall_s": wall}


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
    parser.add_argument("--recipe", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--iters", type=int, help="default: the recipe's (2,000 on the CPU, 5,000 on the GPU)")
    parser.add_argument("--quick", action="store_true", help="a dry run on the CPU: small batches, --iters steps")
    parser.add_argument("--torch-mode", choices=["compile", "cuda_graphs"], default="cuda_graphs",
                        help="the GPU recipe's runtime.torch_mode on tpuplex torch")
    parser.add_argument("--text", type=Path, default=INPUT, help="tiny Shakespeare's input.txt")
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the runs and results.json")
    args = parser.parse_args()
    pythons = {backend: sys.executable for backend in args.backends} | dict(p.split("=", 1) for p in args.python)
    gpu = args.recipe == "gpu"
    args.iters = args.iters or (5000 if gpu else 2000)
    recipe = (GPU_RECIPE if gpu else CPU_RECIPE) + (QUICK["nanogpt"] if args.quick else [])
    config = CONFIG.with_name("gpu.toml") if gpu else CONFIG
    eval_interval = args.iters if args.quick else 250  # both recipes evaluate every 250 iterations

    args.out.mkdir(parents=True, exist_ok=False)
    folder = nanogpt_folder(args.nanogpt, args.out, args.text)
    model = sized_model(config, folder, args.out)

    def settings(backend: str) -> list[str]:
        compiled = [f'runtime.torch_mode="{args.torch_mode}"'] if gpu and backend == "torch" and not args.quick else []
        return [f"model.checkpoint={json.dumps(str(model))}", *compiled, *(QUICK["tpuplex"] if args.quick else [])]

    results: dict[str, list[dict[str, float]]] = {"nanogpt": [], **{backend: [] for backend in args.backends}}
    for seed in args.seeds:  # alternating: each seed runs every side before the next seed
        for side in results:
            row = (run_nanogpt(folder, seed, args.iters, recipe, eval_interval) if side == "nanogpt"
                   else run_tpuplex(side, pythons[side], seed, args.iters, eval_interval, args.out, config,
                                    args.text, settings(side)))
            results[side].append({"seed": seed, **row})
            (args.out / "results.json").write_text(json.dumps(results, indent=2))  # each side's row as it comes
            print(f"seed {seed} {side:8s} {row['iters_per_s']:.2f} it/s, val loss {row['val_loss']:.4f} (best "
                  f"{row['best_val_loss']:.4f}), wall {row['wall_s']:.0f} s", flush=True)
    reference = statistics.mean(row["iters_per_s"] for row in results["nanogpt"])
    print(f"\n{'side':8s}  {'iterations/s':>18s}  {'vs nanoGPT':>10s}  {'val loss at ' + str(args.iters):>20s}  "
          f"{'best val loss':>20s}")
    for side, rows in results.items():
        ratio = statistics.mean(row["iters_per_s"] for row in rows) / reference
        print(f"{side:8s}  {summary(rows, 'iters_per_s'):>18s}  {ratio:>9.2f}x  {summary(rows, 'val_loss'):>20s}  "
              f"{summary(rows, 'best_val_loss'):>20s}")


if __name__ == "__main__":
    main()

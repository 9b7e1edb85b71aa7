"""tpuplex on each backend against that framework's usual fine-tuning script, interleaved in one run.

    python benchmarks/side_by_side.py --tasks mrpc,sst2,rte,wnli --steps 16 \
        --python torch=.nox/speed-torch/bin/python,jax=.nox/speed-jax/bin/python,tf=.nox/speed-tf/bin/python

(`nox -s speed` builds the three environments and runs this.) For each task and backend, every side runs as its
own process, one after another (never two at once), round after round, so machine noise hits every side alike:

    torch          tpuplex-torch (fitted buckets)  vs  hf-trainer, dynamic padding  and  hf-trainer, pad to max_length
    torch-compile  the same with runtime.torch_mode = "compile", against the same peers (timed once per round)
    jax            tpuplex-jax (fitted buckets)    vs  flax-loop (run_flax_glue: pad to max_length)
    tf             tpuplex-tf (fitted buckets)     vs  keras-fit, dynamic padding

and, on the first task only, each backend at the fixed [global_batch, max_length] shape against the plain loop at
that shape (torch-loop, flax-loop, keras-fit, all padded to max_length). Each side trains --steps batches of its
own epoch order twice and times the second pass (`benchmarks/throughput.py`, `benchmarks/peer_loops.py`): the
steady-state examples/s of an epoch, with compilation left out on every side.

Prints the machine's fp32 GEMM peak (numpy, measured before and after), one row per side with the ratio of tpuplex
to each peer, and the model FLOP utilisation (MFU) of the fixed-shape rows. Writes the rows to --out as JSON.
Each row also shows the model's training GFLOP per example at that side's padded lengths and `bound`, the peer's
GFLOP per example over tpuplex's: the ratio that padding alone explains at an equal FLOP rate. `1st s` is the
untimed first pass, compilation included.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tpuplex import checkpoints
from tpuplex import config as config_lib
from tpuplex.tasks.sequence_classification.glue import get_dataset

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parent / "examples" / "glue" / "configs"
GLUE = HERE.parents[1] / "shared" / "glue"
# backend -> the peers its tpuplex row is compared with, as peer_loops.py arguments.
PEERS = {"torch": (("hf-trainer", "dynamic"), ("hf-trainer", "max")),
         "jax": (("flax-loop", "max"),),
         "tf": (("keras-fit", "dynamic"),)}
FIXED_PEERS = {"torch": ("torch-loop", "max"), "jax": ("flax-loop", "max"), "tf": ("keras-fit", "max")}
# compared side -> (the backend whose environment and peers it uses, throughput.py overrides)
TPUPLEX = {"torch": ("torch", ()), "torch-compile": ("torch", ('runtime.torch_mode="compile"',)),
           "jax": ("jax", ()), "tf": ("tf", ())}
FIXED_SHAPE = "data.bucket_count=0"


def gemm_peak(size: int = 2048, repeats: int = 10) -> float:
    """Best fp32 GFLOP/s of numpy's [size, size] @ [size, size] over `repeats` tries."""
    a, b = (np.random.default_rng(0).standard_normal((size, size), np.float32) for _ in range(2))
    a @ b
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e9


def train_flops_per_example(hf_config: dict, length: int) -> float:
    """Forward + backward FLOPs of one example of `length` tokens: 6 x matmul parameters x tokens, plus the
    attention scores and their weighted sum (4 x length^2 x hidden per layer forward, x3 for training)."""
    hidden, layers = hf_config["hidden_size"], hf_config["num_hidden_layers"]
    matmul_params = layers * (4 * hidden * hidden + 2 * hidden * hf_config["intermediate_size"])
    return 6 * matmul_params * length + 12 * layers * length * length * hidden


def run_side(command: tuple[str, ...]) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.exit(f"side_by_side: {' '.join(command)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def sides(task: str, compared: str, fixed: bool, steps: int, data_dir: Path) -> list[tuple[str, list[str]]]:
    """(script, arguments) of every side of one comparison, tpuplex first."""
    backend, overrides = TPUPLEX[compared]
    config = str(CONFIGS / f"{task}.toml")
    common = [config, "--steps", str(steps), "--data-dir", str(data_dir)]
    ours = [*common, "--backend", backend, *(arg for override in overrides for arg in ("--set", override))]
    if fixed:
        peer, pad = FIXED_PEERS[backend]
        return [("throughput.py", [*ours, "--set", FIXED_SHAPE]),
                ("peer_loops.py", [*common, "--peer", peer, "--pad", pad])]
    return [("throughput.py", ours),
            *(("peer_loops.py", [*common, "--peer", peer, "--pad", pad]) for peer, pad in PEERS[backend])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="mrpc,sst2,rte,wnli")
    parser.add_argument("--backends", default="torch,torch-compile,jax,tf", help=f"of {','.join(TPUPLEX)}")
    parser.add_argument("--python", default="", help="backend=interpreter,...: the environment of each backend "
                        "and its peers (default: this interpreter)")
    parser.add_argument("--steps", type=int, default=16, help="timed batches per side")
    parser.add_argument("--rounds", type=int, default=1, help="times every side runs; the median is reported")
    parser.add_argument("--glue-dir", type=Path, default=GLUE)
    parser.add_argument("--out", type=Path, default=Path("runs/side_by_side.json"))
    args = parser.parse_args()
    pythons = dict(item.split("=", 1) for item in args.python.split(",") if item)
    backends = args.backends.split(",")
    tasks = args.tasks.split(",")

    recipe = config_lib.load(CONFIGS / f"{tasks[0]}.toml")
    hf_config = checkpoints.read_hf_config(checkpoints.resolve_checkpoint(recipe.model.checkpoint))
    peak_before = gemm_peak()
    print(f"fp32 GEMM peak (numpy 2048^3): {peak_before:.1f} GFLOP/s; {os.cpu_count()} cores", flush=True)
    comparisons = [(task, backend, False) for task in tasks for backend in backends]
    comparisons += [(tasks[0], backend, True) for backend in backends]
    rows, done = [], {}
    header = f"{'task':5} {'backend':13} {'timing':6} {'side':24} {'ex/s':>7} {'ratio':>6} {'GF/ex':>6} " \
             f"{'bound':>5} {'pad eff':>7} {'lengths':>7} {'programs':>8} {'1st s':>6}"
    print(header, flush=True)
    for task, backend, fixed in comparisons:
        python = pythons.get(TPUPLEX[backend][0], sys.executable)
        measured: dict[str, list[dict]] = {}
        for round_ in range(args.rounds):
            for script, side_args in sides(task, backend, fixed, args.steps, args.glue_dir / get_dataset(task).folder):
                command = (python, str(HERE / script), *side_args)
                if (round_, command) not in done:  # flax-loop at max_length is both a peer and the fixed baseline
                    done[round_, command] = run_side(command)
                measured.setdefault(done[round_, command]["side"], []).append(done[round_, command])
        results = [{**runs[0], "examples_per_s": statistics.median(r["examples_per_s"] for r in runs),
                    "rounds": [r["examples_per_s"] for r in runs]} for runs in measured.values()]
        for result in results:
            result["gflop_per_example"] = statistics.mean(
                train_flops_per_example(hf_config, length) for length in result["lengths"]) / 1e9
        ours = results[0]
        for result in results:
            result.update(backend=backend, comparison="fixed" if fixed else "epoch",
                          ratio=round(ours["examples_per_s"] / result["examples_per_s"], 2),
                          bound=round(result["gflop_per_example"] / ours["gflop_per_example"], 2))
            print(f"{task:5} {backend:13} {result['comparison']:6} {result['side']:24} "
                  f"{result['examples_per_s']:7.2f} {result['ratio']:6.2f} {result['gflop_per_example']:6.2f} "
                  f"{result['bound']:5.2f} {result['padding_efficiency']:7.3f} {len(result['shapes']):7} "
                  f"{result['programs']:8} {result['first_pass_s']:6.0f}", flush=True)
            rows.append(result)
    peak_after = gemm_peak()
    peak = max(peak_before, peak_after)
    print(f"fp32 GEMM peak after: {peak_after:.1f} GFLOP/s; MFU below uses the higher, {peak:.1f}")
    length = recipe.data.max_length
    for row in rows:
        if row["comparison"] == "fixed":  # FLOPs of the padded shape: what the hardware computes
            row["mfu"] = round(row["examples_per_s"] * train_flops_per_example(hf_config, length) / (peak * 1e9), 3)
            print(f"MFU at [{row['global_batch']}, {length}]: {row['task']:5} {row['backend']:13} {row['side']:24} "
                  f"{row['mfu']:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"gemm_peak_gflops": [round(peak_before, 1), round(peak_after, 1)],
                                    "steps": args.steps, "rounds": args.rounds, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

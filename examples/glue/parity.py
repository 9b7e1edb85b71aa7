"""Cross-backend parity: the same fixed scenario on each backend, then a comparison of what they saved.

    python examples/glue/parity.py run --backend jax --out runs/parity   # once per backend, in its own env
    python examples/glue/parity.py compare runs/parity                    # any env with the core; exit 1 on a breach

The scenario: MiniLM, seed 42, dropout off (each framework draws its own masks, so parity is defined without them),
50 training steps on real MRPC, then dev evaluation. `run` saves the logits of the first dev batch before training,
the 50 losses and the dev metrics as `<out>/<backend>.json`. `compare` checks every backend against the first one
listed in REFERENCE order: initial logits within 1e-4 (absolute), every loss within 1e-3 (relative), dev accuracy
within 0.5 points.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from tpuplex import config as config_lib
from tpuplex import glue
from tpuplex import run as run_lib
from tpuplex.reporting import Reporter

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCENARIO = [
    "train.max_steps=50",
    "train.seed=42",
    "model.dropout=false",
    "runtime.log_every=10",
    f'data.data_dir="{REPO.parent / "shared" / "glue" / "MRPC"}"',
]
REFERENCE = ("torch", "jax", "tf")  # HF torch is the reference implementation of the architecture
BOUNDS = {"initial_logits": 1e-4, "losses": 1e-3, "dev_accuracy": 0.5}


def run(backend: str, out: Path) -> None:
    # The output directory is a template filled in per backend, so every backend runs the same config (same hash).
    output_template = out / "{backend}-run"
    config = config_lib.load(HERE / "configs" / "mrpc.toml", [*SCENARIO, f'runtime.output_dir="{output_template}"'])
    scratch = run_lib.output_directory(config, glue.get_task(config.data.task), backend)
    shutil.rmtree(scratch, ignore_errors=True)  # a parity run starts fresh, never from an older checkpoint
    experiment = run_lib.prepare(config, backend)
    first_dev = next(experiment.trainer.eval_batchers["dev"].eval_batches())
    real = first_dev.batch["weight"] > 0
    initial_logits = np.asarray(experiment.backend.predict(experiment.state, first_dev.batch))[real]
    with Reporter(scratch) as reporter:
        result = experiment.trainer.fit(experiment.state, reporter)
    saved = {
        "backend": backend,
        "topology": experiment.topology.report(),
        "config_hash": config.hash(),
        "initial_logits": initial_logits.tolist(),
        "losses": result.losses,
        "dev": result.metrics["dev"],
    }
    out.mkdir(parents=True, exist_ok=True)
    run_lib.write_json_atomic(out / f"{backend}.json", saved)
    print(f"{backend}: {len(result.losses)} losses, dev accuracy {result.metrics['dev']['accuracy']:.4f}")


def compare(out: Path) -> int:
    saved = {name: json.loads((out / f"{name}.json").read_text())
             for name in REFERENCE if (out / f"{name}.json").is_file()}
    if len(saved) < 2:
        print(f"parity needs at least two backends' results in {out}; found {sorted(saved) or 'none'}")
        return 1
    reference_name, reference = next(iter(saved.items()))
    hashes = {result["config_hash"] for result in saved.values()}
    print(f"reference: {reference_name}; config hashes: {', '.join(sorted(hashes))}")
    print(f"{'backend':8} {'max |dlogit|':>14} {'max rel dloss':>14} {'dev acc':>9} {'d acc (pts)':>12}  verdict")
    failed = len(hashes) != 1
    for name, result in saved.items():
        logit_gap = float(np.max(np.abs(np.subtract(result["initial_logits"], reference["initial_logits"]))))
        losses, reference_losses = np.asarray(result["losses"]), np.asarray(reference["losses"])
        if losses.shape != reference_losses.shape:
            loss_gap = float("inf")
        else:
            loss_gap = float(np.max(np.abs(losses - reference_losses) / np.abs(reference_losses)))
        accuracy = 100 * result["dev"]["accuracy"]
        accuracy_gap = abs(accuracy - 100 * reference["dev"]["accuracy"])
        ok = (logit_gap <= BOUNDS["initial_logits"] and loss_gap <= BOUNDS["losses"]
              and accuracy_gap <= BOUNDS["dev_accuracy"])
        failed |= not ok
        print(f"{name:8} {logit_gap:14.2e} {loss_gap:14.2e} {accuracy:9.2f} {accuracy_gap:12.2f}  "
              f"{'ok' if ok else 'BREACH'}")
    print(f"bounds: initial logits <= {BOUNDS['initial_logits']:g}, losses <= {BOUNDS['losses']:g} relative, "
          f"dev accuracy <= {BOUNDS['dev_accuracy']:g} points" + ("; FAILED" if failed else "; passed"))
    return int(failed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run")
    run_parser.add_argument("--backend", required=True)
    run_parser.add_argument("--out", type=Path, default=Path("runs/parity"))
    compare_parser = commands.add_parser("compare")
    compare_parser.add_argument("out", type=Path, nargs="?", default=Path("runs/parity"))
    args = parser.parse_args()
    if args.command == "run":
        run(args.backend, args.out)
        return 0
    return compare(args.out)


if __name__ == "__main__":
    sys.exit(main())

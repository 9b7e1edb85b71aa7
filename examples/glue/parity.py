"""Cross-backend parity: the same fixed scenarios on each backend, then a comparison of what they saved.

    python examples/glue/parity.py checkpoint --out runs/parity          # once, in an env with tpuplex-torch
    python examples/glue/parity.py run --backend jax --out runs/parity   # once per backend, in its own env
    python examples/glue/parity.py compare runs/parity                    # any env with the core; exit 1 on a breach

Two scenarios, one per family: `bert` is MiniLM (BERT); `roberta` is a tiny random RoBERTa (hidden 32, two layers)
that `checkpoint` writes with transformers' own classes and a byte-level BPE tokenizer trained on MRPC's train
sentences. Both: seed 42, dropout off (each framework draws its own masks, so parity is defined without them),
50 training steps on real MRPC, then dev evaluation (`run --set section.field=value` changes the scenario on
every backend alike: the test suite's fast tier runs 10 steps over 2 fitted lengths instead of 8).
`run` saves the logits of the first dev batch before training, the losses and the dev metrics as
`<out>/<scenario>-<backend>.json` (`--scenario bert`: that one alone, on `run` and `compare`). `compare` checks
every backend against the first one listed in REFERENCE order: initial logits within 1e-4 (absolute), every
training loss and the dev loss within 1e-3 (relative). Dev accuracy is printed but not bounded: after 50 steps at
this learning rate every backend predicts MRPC's majority class
(68.38 = 279/408), so equal accuracies would say nothing; the dev loss still moves with every parameter.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from tpuplex import config as config_lib
from tpuplex.commands import run as run_lib
from tpuplex.engine.run_log import Reporter
from tpuplex.tasks.sequence_classification import glue
from tpuplex.tasks.sequence_classification.glue.sources import resolve_source

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MRPC = REPO.parent / "shared" / "glue" / "MRPC"
COMMON = ["train.max_steps=50", "train.seed=42", "model.dropout=false", "runtime.log_every=10",
          f'data.data_dir="{MRPC}"']
ROBERTA_CHECKPOINT = "roberta-tiny"  # under --out


SCENARIOS = ("bert", "roberta")


def scenarios(out: Path, changes: list[str] = (), only: list[str] = SCENARIOS) -> dict[str, list[str]]:
    """Scenario name -> the settings over configs/mrpc.toml (`changes` last, so they win), of the scenarios
    `only` names."""
    common = [*COMMON, *changes]
    every = {"bert": common, "roberta": [*common, f'model.checkpoint="{out / ROBERTA_CHECKPOINT}"']}
    return {name: settings for name, settings in every.items() if name in only}


REFERENCE = ("torch", "jax", "tf")  # HF torch is the reference implementation of the architecture
BOUNDS = {"initial_logits": 1e-4, "losses": 1e-3, "dev_loss": 1e-3}


def write_roberta_checkpoint(out: Path) -> Path:
    """The tiny RoBERTa of the second scenario, its tokenizer trained on MRPC's train sentences."""
    from tpuplex_torch.testing import write_checkpoint  # the torch env only: it writes with transformers

    examples = resolve_source(glue.get_dataset("mrpc"), "train", MRPC).read()
    path = write_checkpoint("roberta", out / ROBERTA_CHECKPOINT, seed=0, corpus=examples.text_a + examples.text_b,
                            vocab_size=2000, max_length=128)
    print(f"wrote {path}")
    return path


def run(backend: str, out: Path, changes: list[str] = (), only: list[str] = SCENARIOS) -> None:
    for scenario, settings in scenarios(out, changes, only).items():
        run_scenario(scenario, settings, backend, out)


def run_scenario(scenario: str, settings: list[str], backend: str, out: Path) -> None:
    # The output directory is a template filled in per backend, so every backend runs the same config (same hash).
    output_template = out / f"{scenario}-{{backend}}-run"
    config = config_lib.load(HERE / "configs" / "mrpc.toml", [*settings, f'runtime.output_dir="{output_template}"'])
    scratch = run_lib.output_directory(config, backend)
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
    run_lib.write_json_atomic(out / f"{scenario}-{backend}.json", saved)
    print(f"{scenario} on {backend}: {len(result.losses)} losses, dev accuracy "
          f"{result.metrics['dev']['accuracy']:.4f}")


def compare(out: Path, only: list[str] = SCENARIOS) -> int:
    return int(any([compare_scenario(scenario, out) for scenario in scenarios(out, only=only)]))


def compare_scenario(scenario: str, out: Path) -> bool:
    """Print one scenario's table; True when it breaches a bound or lacks results."""
    saved = {name: json.loads((out / f"{scenario}-{name}.json").read_text())
             for name in REFERENCE if (out / f"{scenario}-{name}.json").is_file()}
    if len(saved) < 2:
        print(f"{scenario}: parity needs at least two backends' results in {out}; found {sorted(saved) or 'none'}")
        return True
    reference_name, reference = next(iter(saved.items()))
    hashes = {result["config_hash"] for result in saved.values()}
    print(f"{scenario}: reference {reference_name}; config hashes: {', '.join(sorted(hashes))}")
    print(f"{'backend':8} {'max |dlogit|':>14} {'max rel dloss':>14} {'rel d dev loss':>15} {'dev acc':>9}  verdict")
    failed = len(hashes) != 1
    for name, result in saved.items():
        logit_gap = float(np.max(np.abs(np.subtract(result["initial_logits"], reference["initial_logits"]))))
        losses, reference_losses = np.asarray(result["losses"]), np.asarray(reference["losses"])
        if losses.shape != reference_losses.shape:
            loss_gap = float("inf")
        else:
            loss_gap = float(np.max(np.abs(losses - reference_losses) / np.abs(reference_losses)))
        dev_loss_gap = abs(result["dev"]["loss"] - reference["dev"]["loss"]) / abs(reference["dev"]["loss"])
        ok = (logit_gap <= BOUNDS["initial_logits"] and loss_gap <= BOUNDS["losses"]
              and dev_loss_gap <= BOUNDS["dev_loss"])
        failed |= not ok
        print(f"{name:8} {logit_gap:14.2e} {loss_gap:14.2e} {dev_loss_gap:15.2e} {100 * result['dev']['accuracy']:9.2f}"
              f"  {'ok' if ok else 'BREACH'}")
    print(f"bounds: initial logits <= {BOUNDS['initial_logits']:g}, losses and dev loss <= {BOUNDS['losses']:g} "
          "relative" + ("; FAILED" if failed else "; passed") + "\n")
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("checkpoint").add_argument("--out", type=Path, default=Path("runs/parity"))
    run_parser = commands.add_parser("run")
    run_parser.add_argument("--backend", required=True)
    run_parser.add_argument("--out", type=Path, default=Path("runs/parity"))
    run_parser.add_argument("--set", dest="changes", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                            help="change the scenario (the same on every backend: compare checks the config hash)")
    compare_parser = commands.add_parser("compare")
    compare_parser.add_argument("out", type=Path, nargs="?", default=Path("runs/parity"))
    for command in (run_parser, compare_parser):
        command.add_argument("--scenario", dest="only", action="append", choices=SCENARIOS,
                             help="this scenario only (repeatable; default: every one)")
    args = parser.parse_args()
    if args.command == "checkpoint":
        write_roberta_checkpoint(args.out)
        return 0
    if args.command == "run":
        run(args.backend, args.out, args.changes, args.only or SCENARIOS)
        return 0
    return compare(args.out, args.only or SCENARIOS)


if __name__ == "__main__":
    sys.exit(main())

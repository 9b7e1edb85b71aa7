"""Training throughput of one backend on a config's real training data, as `tpuplex train` would batch it.

    python benchmarks/throughput.py examples/glue/configs/mrpc.toml --backend jax --steps 16
    python benchmarks/throughput.py examples/glue/configs/mrpc.toml --backend torch --set data.bucket_count=0

The experiment is built by `tpuplex.commands.run.prepare`, the code behind `tpuplex train` (model, optimizer, fitted
buckets, devices), and nothing is written. The first --steps batches of the first epoch (a random sample of the
epoch's batches: the Batcher shuffles batches across buckets) run twice: the first pass compiles every program they
need (its seconds are printed too), the second is timed. `--set data.bucket_count=0` pads every batch to
data.max_length: a fixed [batch, length] step. `--set 'runtime.torch_mode="compile"'` times torch.compile.
Prints one JSON line; `benchmarks/peer_loops.py` prints the same fields for the frameworks' own scripts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

from tpuplex import config as config_lib
from tpuplex.commands import run
from tpuplex.data.batching import padding_efficiency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the experiment's TOML file")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--steps", type=int, default=16, help="batches timed (each runs once untimed first)")
    parser.add_argument("--data-dir", help="folder with the task's GLUE files (sets data.data_dir)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = parser.parse_args()
    overrides = [*args.overrides, *([f'data.data_dir="{args.data_dir}"'] if args.data_dir else [])]
    config = config_lib.load(args.config, overrides)
    experiment = run.prepare(config, args.backend, args.config)
    backend, state = experiment.backend, experiment.state
    batcher = experiment.trainer.train_batcher
    k = config.train.steps_per_execution
    batches = list(itertools.islice(batcher.train_batches(epoch=0), args.steps // k * k))
    rates = [config.train.learning_rate] * k

    def one_pass(state):
        losses = []
        for begin in range(0, len(batches), k):
            state, group_losses = backend.train_steps(state, batches[begin:begin + k], rates)
            losses.extend(float(loss) for loss in group_losses)
        return state, losses

    start = time.perf_counter()
    state, _ = one_pass(state)
    first_pass = time.perf_counter() - start
    start = time.perf_counter()
    state, losses = one_pass(state)
    elapsed = time.perf_counter() - start
    examples = len(batches) * config.train.global_batch
    compiled = "-compile" if config.runtime.torch_mode == "compile" else ""
    print(json.dumps({
        "side": f"tpuplex-{args.backend}{compiled}",
        "task": experiment.task.name,
        "topology": experiment.topology.report(),
        "buckets": list(batcher.lengths),
        "steps": len(batches),
        "global_batch": config.train.global_batch,
        "examples_per_s": round(examples / elapsed, 2),
        "step_ms": round(1000 * elapsed / len(batches), 1),
        "padding_efficiency": round(padding_efficiency(batches), 4),
        "shapes": sorted({b["input_ids"].shape[1] for b in batches}),
        "lengths": [b["input_ids"].shape[1] for b in batches],
        "first_pass_s": round(first_pass, 1),
        "programs": backend.compile_count(),
        "last_loss": round(losses[-1], 4),
    }))


if __name__ == "__main__":
    main()

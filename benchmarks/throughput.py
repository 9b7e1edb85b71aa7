"""Training throughput of any installed backend on real MRPC text at a fixed sequence length.

    python benchmarks/throughput.py --backend jax --cpu-devices 8 --seq-len 128 --global-batch 32 --steps 20

Every batch is padded to --seq-len (no buckets), so the figure is the cost of a [global_batch, seq_len] step.
The first --warmup steps (compilation) are excluded from the timing; the compile count is read after the run.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tpuplex import config as config_lib
from tpuplex import glue, params, registry
from tpuplex.collate import Batcher
from tpuplex.protocol import ModelSpec, OptimizerSpec

SHARED_MRPC = Path(__file__).resolve().parents[2] / "shared" / "glue" / "MRPC"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True)
    parser.add_argument("--cpu-devices", type=int, default=0, help="split the CPU into N devices (0: default)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation)")
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--data-dir", default=str(SHARED_MRPC))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = parser.parse_args()

    config = config_lib.load(None, [
        f"runtime.cpu_devices={args.cpu_devices}", f"train.global_batch={args.global_batch}",
        f"train.steps_per_execution={args.steps_per_execution}", *args.overrides,
    ])
    backend = registry.create(args.backend, config.runtime)
    topology = backend.topology()

    checkpoint_dir = params.resolve_checkpoint(config.model.checkpoint)
    hf_config = params.read_hf_config(checkpoint_dir)
    task = glue.get_task("mrpc")
    encoded = glue.load_encoded(task, "train", args.data_dir, checkpoint_dir, args.seq_len,
                                Path(config.data.cache_dir))
    batcher = Batcher(encoded, args.global_batch, topology.device_count, buckets=(), seed=config.train.seed)

    train = config.train
    model = ModelSpec(hf_config=hf_config, params=params.initial_params(checkpoint_dir, hf_config, task.num_labels,
                                                                        train.seed),
                      num_labels=task.num_labels, dropout=config.model.dropout, checkpoint_dir=checkpoint_dir)
    optimizer = OptimizerSpec(weight_decay=train.weight_decay, beta1=train.adam_beta1, beta2=train.adam_beta2,
                              epsilon=train.adam_epsilon, clip_norm=train.clip_norm, grad_accum=train.grad_accum,
                              bf16=train.bf16, seed=train.seed)
    state = backend.init(model, optimizer)

    k = args.steps_per_execution
    batches = iter(batcher.train_batches(epoch=0))
    calls = -(-(args.warmup + args.steps) // k)
    warmup_calls = -(-args.warmup // k)
    losses, start = [], 0.0
    for call in range(calls):
        if call == warmup_calls:
            start = time.perf_counter()
        group = [next(batches) for _ in range(k)]
        state, group_losses = backend.train_steps(state, group, [train.learning_rate] * k)
        losses.extend(group_losses)
    elapsed = time.perf_counter() - start
    timed_steps = (calls - warmup_calls) * k
    examples = timed_steps * args.global_batch
    print(json.dumps({
        "backend": args.backend,
        "topology": topology.report(),
        "seq_len": args.seq_len,
        "global_batch": args.global_batch,
        "steps_per_execution": k,
        "timed_steps": timed_steps,
        "examples_per_s": round(examples / elapsed, 2),
        "tokens_per_s": round(examples * args.seq_len / elapsed, 1),
        "step_ms": round(1000 * elapsed / timed_steps, 1),
        "compile_count": backend.compile_count(),
        "last_loss": round(float(losses[-1]), 4),
    }))


if __name__ == "__main__":
    main()

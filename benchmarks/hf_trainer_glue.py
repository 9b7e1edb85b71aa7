"""The HF Trainer peer of `tpuplex sweep`: transformers' own Trainer on the same checkpoint, GLUE files and recipe.

    python benchmarks/hf_trainer_glue.py --task mrpc --data-dir ../shared/glue/MRPC --seeds 1,2,3,4,5 --out runs/hf

Run it where transformers 5 and torch are installed (the glue-torch nox environment plus `accelerate`). The recipe
is `examples/glue/configs/base.toml` read through tpuplex's own config reader: learning rate, weight decay, warmup
ratio, epochs, batch size, max length and clip norm; AdamW with linear decay and dynamic padding (`pad_batch`, what
HF's `DataCollatorWithPadding` does). The data are the same GLUE files, read and tokenized by tpuplex (so both
sides train on the same token ids) and handed to the Trainer as plain lists. Prints one JSON line per seed and the
mean ± sample std of each dev metric, and writes `<out>/hf_trainer.json` in the layout of tpuplex's sweep.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments, set_seed

import torch
from tpuplex import checkpoints
from tpuplex import config as config_lib
from tpuplex.commands.sweep import markdown
from tpuplex.metrics import compute
from tpuplex.tasks.sequence_classification.features import load_encoded
from tpuplex.tasks.sequence_classification.glue import get_dataset

BASE = Path(__file__).resolve().parents[1] / "examples" / "glue" / "configs" / "base.toml"


class Rows(torch.utils.data.Dataset):
    """An encoded split as the Trainer takes it: one dict of unpadded lists per example."""

    def __init__(self, encoded):
        self.encoded = encoded

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, index: int) -> dict:
        length = int(self.encoded.lengths[index])
        return {"input_ids": self.encoded.input_ids[index, :length].tolist(),
                "token_type_ids": self.encoded.token_type_ids[index, :length].tolist(),
                "attention_mask": [1] * length, "labels": int(self.encoded.labels[index])}


def training_arguments(recipe, out: Path, seed: int, **changes) -> TrainingArguments:
    """The recipe's optimizer, schedule and batch size as the Trainer's arguments (CPU, no saving, no logging
    integrations); `changes` override or add arguments."""
    train = recipe.train
    recipe_args = dict(
        output_dir=str(out), seed=seed, learning_rate=train.learning_rate, weight_decay=train.weight_decay,
        warmup_steps=train.warmup_ratio,  # a float < 1 is a ratio of the steps
        num_train_epochs=train.epochs, per_device_train_batch_size=train.global_batch,
        per_device_eval_batch_size=train.global_batch, max_grad_norm=train.clip_norm, lr_scheduler_type="linear",
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True)
    return TrainingArguments(**{**recipe_args, **changes})


def run_seed(task, seed: int, recipe, model_dir: Path, train, dev, out: Path, max_steps: int) -> dict[str, float]:
    # run_glue.py seeds before loading: the classifier head that from_pretrained draws is then the seed's own, not
    # whatever the previous seed's training left in torch's generator.
    set_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=task.num_labels)
    args = training_arguments(recipe, out / f"seed-{seed}", seed, logging_steps=50, max_steps=max_steps)
    trainer = Trainer(model=model, args=args, train_dataset=Rows(train), data_collator=pad_batch)
    trainer.train()
    logits = trainer.predict(Rows(dev)).predictions
    return compute(task, np.asarray(logits, np.float32), dev.labels)


def pad_batch(features: list[dict]) -> dict[str, torch.Tensor]:
    """Dynamic padding: every example of the batch right-padded with 0 (BERT's pad id) to the longest one."""
    longest = max(len(f["input_ids"]) for f in features)
    batch = {key: torch.tensor([f[key] + [0] * (longest - len(f[key])) for f in features])
             for key in ("input_ids", "token_type_ids", "attention_mask")}
    batch["labels"] = torch.tensor([f["labels"] for f in features])
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--out", type=Path, default=Path("runs/hf"))
    parser.add_argument("--max-steps", type=int, default=-1, help="stop early (a smoke test); -1: the epochs")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = parser.parse_args()
    recipe = config_lib.load(BASE, args.overrides)
    task = get_dataset(args.task)
    model_dir = checkpoints.resolve_checkpoint(recipe.model.checkpoint)
    cache = Path(recipe.data.cache_dir).expanduser()
    train, dev = (load_encoded(task, split, args.data_dir, model_dir, recipe.data.max_length, cache).load()
                  for split in ("train", "dev"))
    seeds = [int(s) for s in args.seeds.split(",")]
    values: dict[str, list[float]] = {}
    for seed in seeds:
        metrics = run_seed(task, seed, recipe, model_dir, train, dev, args.out, args.max_steps)
        print(json.dumps({"seed": seed, **metrics}), flush=True)
        for name, value in metrics.items():
            values.setdefault(f"dev {name}", []).append(value)
    summary = {"task": task.name, "backend": "hf-trainer", "seeds": seeds, "runs": [],
               "metrics": {name: {"mean": float(np.mean(v)), "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0,
                                  "values": v} for name, v in values.items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hf_trainer.json").write_text(json.dumps(summary, indent=2))
    print(markdown(summary))


if __name__ == "__main__":
    main()

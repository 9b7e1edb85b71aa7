"""tpuplex's masked-LM pre-training beside HF's `run_mlm` recipe, on the same checkpoint, text and settings.

    python benchmarks/hf_run_mlm.py --seeds 1,2,3 --steps 60 --out runs/mlm-bench

Run it where tpuplex-torch, transformers 5 and accelerate are installed (the tests-torch nox environment plus
`accelerate`). For each seed, in turn so both see the same machine load:

- HF: `run_mlm.py`'s recipe written out: every non-blank line a document, tokenized by `AutoTokenizer`,
  concatenated and cut into rows of max_length (`group_texts`), `AutoModelForMaskedLM` (MiniLM has no MLM head:
  HF draws it), `DataCollatorForLanguageModeling` (15%, 80/10/10), the Trainer with AdamW and linear decay; the
  held-out loss is `Trainer.evaluate` on the first 5% of the lines (run_mlm's validation_split_percentage);
- tpuplex: `tpuplex train examples/mlm/tinyshakespeare.toml --backend torch --set train.seed=<seed>`, the same
  held-out lines (task.validation_fraction = 0.05).

Both stop after `--steps` optimizer steps; learning rate, weight decay, warmup, batch size, max length and clip
norm come from the example config. Train tokens/s: tokens trained per second of training (evaluation excluded on
both sides). Prints one JSON line per seed and run, then the mean and sample std of each figure.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import datasets
from seeds import run_tpuplex, side_by_side
from transformers import (
    AutoModelForMaskedLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
    set_seed,
)

from tpuplex import checkpoints
from tpuplex import config as config_lib

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "mlm" / "tinyshakespeare.toml"


def grouped(tokenizer, lines: list[str], max_length: int) -> datasets.Dataset:
    """run_mlm's tokenize + group_texts (the last, shorter row dropped, as run_mlm drops it)."""
    ids = list(itertools.chain.from_iterable(tokenizer(lines, add_special_tokens=True)["input_ids"]))
    rows = [ids[start:start + max_length] for start in range(0, len(ids) - max_length + 1, max_length)]
    return datasets.Dataset.from_dict({"input_ids": rows})


def hf_seed(seed: int, recipe, steps: int, model_dir: Path, train_lines: list[str], held_out: list[str],
            out: Path) -> dict[str, float]:
    train, max_length = recipe.train, recipe.data.max_length
    set_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForMaskedLM.from_pretrained(model_dir)
    args = TrainingArguments(
        output_dir=str(out / f"hf-{seed}"), seed=seed, learning_rate=train.learning_rate,
        weight_decay=train.weight_decay, warmup_steps=train.warmup_ratio, max_steps=steps,
        per_device_train_batch_size=train.global_batch, per_device_eval_batch_size=train.global_batch,
        max_grad_norm=train.clip_norm, lr_scheduler_type="linear", save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, logging_steps=20)
    trainer = Trainer(model=model, args=args, train_dataset=grouped(tokenizer, train_lines, max_length),
                      eval_dataset=grouped(tokenizer, held_out, max_length),
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15))
    seconds = trainer.train().metrics["train_runtime"]
    tokens = steps * train.global_batch * max_length
    return {"run": "hf", "seed": seed, "train_tokens_per_s": round(tokens / seconds, 1),
            "held_out_loss": float(trainer.evaluate()["eval_loss"])}


def tpuplex_seed(seed: int, steps: int, out: Path) -> dict[str, float]:
    results = run_tpuplex(CONFIG, "torch", seed, out / f"tpuplex-{seed}", f"train.max_steps={steps}",
                          "runtime.eval_every=0")
    return {"run": "tpuplex-torch", "seed": seed, "train_tokens_per_s": results["train"]["tokens_per_s"],
            "held_out_loss": results["metrics"]["validation"]["loss"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path("runs/mlm-bench"))
    args = parser.parse_args()
    recipe = config_lib.load(CONFIG)
    model_dir = checkpoints.resolve_checkpoint(recipe.model.checkpoint)
    lines = [line.strip() for line in (ROOT / recipe.data.train_file).read_text().splitlines() if line.strip()]
    held = max(1, int(len(lines) * 0.05))
    side_by_side(
        [int(seed) for seed in args.seeds.split(",")],
        {"hf": lambda seed: hf_seed(seed, recipe, args.steps, model_dir, lines[held:], lines[:held], args.out),
         "tpuplex-torch": lambda seed: tpuplex_seed(seed, args.steps, args.out)},
        ("held_out_loss", "train_tokens_per_s"), args.out)


if __name__ == "__main__":
    main()

"""tpuplex's token classification beside HF's `run_ner` recipe, on the same checkpoint, files and settings.

    python benchmarks/hf_run_ner.py --seeds 1,2,3 --out runs/ner-bench

Run it where tpuplex-torch, transformers 5, accelerate and seqeval are installed (the tests-torch nox environment
plus `accelerate seqeval`). For each seed, in turn so both see the same machine load:

- HF: `run_ner.py`'s recipe written out: `AutoTokenizer` with `is_split_into_words`, the first sub-token of each
  word labelled and the rest -100, `AutoModelForTokenClassification`, `DataCollatorForTokenClassification`
  (dynamic padding), the Trainer with AdamW and linear decay, and seqeval (default mode) on the words that kept a
  label, as run_ner's `compute_metrics` scores them;
- tpuplex: `tpuplex train examples/ner/wnut17.toml --backend torch --set train.seed=<seed>`.

Both take learning rate, weight decay, warmup, epochs, batch size, max length and clip norm from the example
config. Train tokens/s: real (unpadded) tokens trained per second of training, HF's from `train_runtime`,
tpuplex's from results.json (evaluation excluded on both sides). Prints one JSON line per seed and run, then the
mean and sample std of dev and test F1 and the tokens/s ratio.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from seeds import run_tpuplex, side_by_side
from seqeval.metrics import f1_score
from transformers import (
    AutoModelForTokenClassification,
    AutoTokenizer,
    DataCollatorForTokenClassification,
    Trainer,
    TrainingArguments,
    set_seed,
)

import torch
from tpuplex import checkpoints
from tpuplex import config as config_lib
from tpuplex.tasks.token_classification import data as tagged

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "ner" / "wnut17.toml"


class Aligned(torch.utils.data.Dataset):
    """run_ner's `tokenize_and_align_labels`: one dict of unpadded lists per sentence."""

    def __init__(self, tokenizer, sentences: tagged.Sentences, tag_index: dict[str, int], max_length: int):
        encoded = tokenizer(sentences.words, is_split_into_words=True, truncation=True, max_length=max_length)
        self.rows = []
        for row, tags in enumerate(sentences.tags):
            previous, labels = None, []
            for word in encoded.word_ids(row):
                labels.append(-100 if word is None or word == previous else tag_index[tags[word]])
                previous = word
            self.rows.append({**{key: values[row] for key, values in encoded.items()}, "labels": labels})

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return self.rows[index]


def hf_seed(seed: int, recipe, model_dir: Path, splits: dict[str, tagged.Sentences], tags: tuple[str, ...],
            out: Path) -> dict[str, float]:
    train = recipe.train
    set_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForTokenClassification.from_pretrained(
        model_dir, num_labels=len(tags), id2label=dict(enumerate(tags)), label2id={t: i for i, t in enumerate(tags)})
    index = {tag: i for i, tag in enumerate(tags)}
    data = {name: Aligned(tokenizer, found, index, recipe.data.max_length) for name, found in splits.items()}
    args = TrainingArguments(
        output_dir=str(out / f"hf-{seed}"), seed=seed, learning_rate=train.learning_rate,
        weight_decay=train.weight_decay, warmup_steps=train.warmup_ratio, num_train_epochs=train.epochs,
        per_device_train_batch_size=train.global_batch, per_device_eval_batch_size=train.global_batch,
        max_grad_norm=train.clip_norm, lr_scheduler_type="linear", save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, logging_steps=50)
    trainer = Trainer(model=model, args=args, train_dataset=data["train"],
                      data_collator=DataCollatorForTokenClassification(tokenizer))
    seconds = trainer.train().metrics["train_runtime"]
    tokens = sum(len(row["input_ids"]) for row in data["train"].rows) * train.epochs
    result = {"run": "hf", "seed": seed, "train_tokens_per_s": round(tokens / seconds, 1)}
    for name in ("dev", "test"):
        prediction = trainer.predict(data[name])
        best, labels = prediction.predictions.argmax(-1), prediction.label_ids
        gold = [[tags[t] for t in row if t != -100] for row in labels]
        guessed = [[tags[p] for p, t in zip(pred, row, strict=True) if t != -100] for pred, row in zip(best, labels,
                                                                                                    strict=True)]
        result[f"{name}_f1"] = float(f1_score(gold, guessed))
    return result


def tpuplex_seed(seed: int, out: Path) -> dict[str, float]:
    results = run_tpuplex(CONFIG, "torch", seed, out / f"tpuplex-{seed}")
    metrics = results["metrics"]
    return {"run": "tpuplex-torch", "seed": seed, "train_tokens_per_s": results["train"]["tokens_per_s"],
            "dev_f1": metrics["emerging.dev"]["f1"], "test_f1": metrics["emerging.test"]["f1"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--out", type=Path, default=Path("runs/ner-bench"))
    args = parser.parse_args()
    recipe = config_lib.load(CONFIG)
    model_dir = checkpoints.resolve_checkpoint(recipe.model.checkpoint)
    files = {"train": recipe.data.train_file, "dev": recipe.data.eval_files[0], "test": recipe.data.eval_files[1]}
    splits = {name: tagged.read_sentences(tagged.data_file(name, str(ROOT / spec)), -1, "tokens", "tags")
              for name, spec in files.items()}
    tags = tagged.tag_set(splits["train"])
    side_by_side([int(seed) for seed in args.seeds.split(",")],
                 {"hf": lambda seed: hf_seed(seed, recipe, model_dir, splits, tags, args.out),
                  "tpuplex-torch": lambda seed: tpuplex_seed(seed, args.out)},
                 ("dev_f1", "test_f1", "train_tokens_per_s"), args.out)


if __name__ == "__main__":
    main()

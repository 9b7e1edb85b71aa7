"""SmolLM2-135M-Instruct on SST-2 as instructions: tpuplex's LoRA example beside the same recipe in transformers +
peft with HF's Trainer, run alternately on this machine, and the base model zero-shot.

    python benchmarks/smollm2_sst2.py --seeds 1,2,3 --out runs/smollm2-bench [--backends jax,tf] [--full]

tpuplex: `tpuplex train examples/smollm2/sst2_lora.toml --backend torch --set train.seed=S` (LoRA rank 8, alpha 16
on q_proj and v_proj; 48 steps of 8 conversations; AdamW lr 1e-3, linear decay after 10% warmup, weight decay
0.01, clip 1.0; loss on the answers alone; all 872 dev conversations evaluated). The peer: the same model (the HF
folder `model.checkpoint = "smollm2"` converts the GGUF into), the same conversations rendered by the same chat
template through `tokenizer.apply_chat_template`, labels -100 outside the answer, `peft.get_peft_model` with the
same LoraConfig, `transformers.Trainer` with the same optimizer, schedule, batch and steps (its own shuffled order
and dynamic padding), seed S; its dev answer_accuracy computed as tpuplex's (every answer token the argmax). Each
seed runs tpuplex, then the peer. `--backends` adds one seed of the LoRA example on each; `--full` one run of
examples/smollm2/sst2_full.toml (every parameter trained). `--train-file` / `--dev-file` give both sides other
SST-2-shaped tables (`sentence`, `label`), e.g. `--short-words 4`'s: the training rows of at most that many words,
written into <out> (nothing is copied into the repository). Writes <out>/summary.json and prints a table.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tpuplex import config as tpuplex_config

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "smollm2" / "sst2_lora.toml"
FULL = REPO / "examples" / "smollm2" / "sst2_full.toml"


def data_sets(train_file: Path | None, dev_file: Path | None) -> list[str]:
    """`--set` overrides giving the example other training and dev tables."""
    return ([f"data.train_file={json.dumps(str(train_file.resolve()))}"] if train_file else []) + \
        ([f"data.eval_files=[{json.dumps(str(dev_file.resolve()))}]"] if dev_file else [])


def short_rows(source: Path, words: int, out: Path) -> Path:
    """The rows of SST-2 table `source` whose sentence has at most `words` words, written to `out`."""
    with source.open(encoding="utf-8", newline="") as handle:
        rows = [row for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
                if len(row["sentence"].split()) <= words]
    out.write_text("sentence\tlabel\n" + "".join(f"{row['sentence']}\t{row['label']}\n" for row in rows),
                   encoding="utf-8")
    return out


def tpuplex_run(config: Path, backend: str, out: Path, *sets: str) -> dict:
    """`tpuplex train` of `config` into `out`; its results.json."""
    command = [sys.executable, "-m", "tpuplex", "train", str(config), "--backend", backend,
               "--set", f"runtime.output_dir={json.dumps(str(out))}", *(arg for s in sets for arg in ("--set", s))]
    subprocess.run(command, check=True)
    results = json.loads((out / "results.json").read_text())
    dev = results["metrics"]["dev"]
    return {"answer_accuracy": dev["answer_accuracy"], "answer_loss": dev["loss"],
            "train_tokens_per_s": results["train"]["tokens_per_s"], "train_tokens": results["train"]["tokens"],
            "train_seconds": results["train"]["seconds"],
            "parameters": results["parameters"]}


def peer_conversations(tokenizer, options: dict, path: Path) -> list[dict]:
    """The SST-2 table at `path` as the peer trains on it: each row the example's conversation (its prompt
    template's review, the label's word as the answer) through `tokenizer.apply_chat_template`, labels -100
    outside the answer."""
    prompt = options["prompt_template"].replace("{{ sentence | trim }}", "{sentence}")
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    encoded = []
    for row in rows:
        user = [{"role": "user", "content": prompt.format(sentence=row["sentence"].strip())}]
        answer = {"role": "assistant", "content": ["negative", "positive"][int(row["label"])]}
        start = len(tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"])
        ids = tokenizer.apply_chat_template([*user, answer], tokenize=True, return_dict=True)["input_ids"]
        encoded.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": [-100] * start + ids[start:]})
    return encoded


def peer_run(seed: int, out: Path, sets: list[str]) -> dict:
    """The example's recipe, with the `--set` overrides `sets`, in transformers + peft + HF's Trainer (see the
    module doc)."""
    import numpy as np
    import peft
    import transformers

    import torch
    from tpuplex.checkpoints import resolve_checkpoint
    from tpuplex.engine.schedule import warmup_steps

    settings = tpuplex_config.load(EXAMPLE, sets)
    train, lora, options = settings.train, settings.model.lora, settings.task.options
    folder = resolve_checkpoint(settings.model.checkpoint)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    train_rows, dev_rows = (peer_conversations(tokenizer, options, Path(spec))
                            for spec in (settings.data.train_file, settings.data.eval_files[0]))
    transformers.set_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = peft.get_peft_model(model, peft.LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=0.0,
                                                       target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=train.max_steps, per_device_train_batch_size=train.global_batch,
        learning_rate=train.learning_rate, lr_scheduler_type="linear",
        warmup_steps=warmup_steps(train.max_steps, train.warmup_ratio), weight_decay=train.weight_decay,
        max_grad_norm=train.clip_norm, adam_epsilon=train.adam_epsilon, seed=seed, data_seed=seed,
        logging_steps=8, save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
        include_num_input_tokens_seen="non_padding")
    collator = transformers.DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=train_rows, data_collator=collator)
    metrics = trainer.train().metrics
    tokens = trainer.state.num_input_tokens_seen

    model.eval()
    right = []
    with torch.no_grad():
        for first in range(0, len(dev_rows), 32):
            batch = collator(dev_rows[first:first + 32])
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            predicted, targets = logits[:, :-1].argmax(-1), batch["labels"][:, 1:]
            answer = targets != -100
            right += ((predicted == targets) | ~answer).all(dim=1).tolist()
    return {"answer_accuracy": float(np.mean(right)), "train_tokens_per_s": tokens / metrics["train_runtime"],
            "train_tokens": tokens, "train_seconds": metrics["train_runtime"]}


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.4f} (min {min(values):.4f}, max {max(values):.4f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--backends", default="", help="one LoRA seed on each of these too, e.g. jax,tf")
    parser.add_argument("--full", action="store_true", help="one run of every parameter fine-tuned")
    parser.add_argument("--out", type=Path, default=Path("runs/smollm2-bench"))
    parser.add_argument("--train-file", type=Path, help="the training table instead of SST-2's train.tsv")
    parser.add_argument("--dev-file", type=Path, help="the evaluated table instead of SST-2's dev.tsv")
    parser.add_argument("--short-words", type=int, help="train on SST-2's training rows of at most this many words")
    parser.add_argument("--no-zero-shot", action="store_true", help="skip the base model's evaluation")
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} already exists: give a new --out (nothing there is overwritten)")
    if args.short_words and args.train_file:
        raise SystemExit("--short-words picks SST-2's short training rows; it cannot be given with --train-file")
    args.out.mkdir(parents=True)
    if args.short_words:
        source = (EXAMPLE.parent / tpuplex_config.load(EXAMPLE).data.train_file).resolve()
        args.train_file = short_rows(source, args.short_words, args.out / f"train-{args.short_words}-words.tsv")
    sets = data_sets(args.train_file, args.dev_file)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    started = time.strftime("%Y-%m-%d %H:%M")
    summary: dict = {"started": started, "seeds": seeds, "data": sets, "tpuplex": {}, "peer": {}}
    if not args.no_zero_shot:
        summary["zero_shot"] = tpuplex_run(EXAMPLE, "torch", args.out / "zero-shot", "train.max_steps=0",
                                           "train.epochs=0", *sets)
    for seed in seeds:
        summary["tpuplex"][seed] = tpuplex_run(EXAMPLE, "torch", args.out / f"tpuplex-{seed}", f"train.seed={seed}",
                                               *sets)
        summary["peer"][seed] = peer_run(seed, args.out / f"peer-{seed}", sets)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for backend in filter(None, args.backends.split(",")):
        summary[f"tpuplex-{backend}"] = tpuplex_run(EXAMPLE, backend, args.out / f"tpuplex-{backend}",
                                                    f"train.seed={seeds[0]}", *sets)
    if args.full:
        summary["full"] = tpuplex_run(FULL, "torch", args.out / "full", f"train.seed={seeds[0]}", *sets)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    if "zero_shot" in summary:
        print(f"zero-shot base: dev answer_accuracy {summary['zero_shot']['answer_accuracy']:.4f}")
    totals = {}
    for who in ("tpuplex", "peer"):
        runs = list(summary[who].values())
        # The seeds' tokens over their seconds, summed: a mean of rates would weigh a slow seed as a fast one.
        seconds = sum(r["train_seconds"] for r in runs)
        totals[who] = sum(r["train_tokens"] for r in runs) / seconds
        per_seed = ", ".join(f"{r['train_tokens_per_s']:.1f}" for r in runs)
        print(f"{who} LoRA, seeds {args.seeds}: dev answer_accuracy {spread([r['answer_accuracy'] for r in runs])}, "
              f"train tokens/s {totals[who]:.1f} over {seconds:.1f} s (seeds: {per_seed})")
    print(f"tpuplex / peer: {totals['tpuplex'] / totals['peer']:.3f}x the tokens a second")
    for key in (k for k in summary if k.startswith("tpuplex-") or k == "full"):
        run = summary[key]
        print(f"{key}: dev answer_accuracy {run['answer_accuracy']:.4f}, train tokens/s "
              f"{run['train_tokens_per_s']:.1f}, optimizer state {run['parameters']['optimizer_state_bytes']:,} B")


if __name__ == "__main__":
    main()

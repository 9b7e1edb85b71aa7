"""SmolLM2-135M-Instruct on SST-2 as a chat task: zero-shot, then fully fine-tuned on the answers, tpuplex's CLI.

    python benchmarks/smollm2_sst2.py --backend torch --train-rows 64 --epochs 2 --out runs/smollm2-sst2

Each SST-2 sentence (../shared/glue/SST-2) becomes a conversation: the user gives the review and asks "Is this review
positive or negative? Answer with one word.", the assistant answers `positive` or `negative`. The first
`--train-rows` training sentences train, all 872 dev sentences are held out. Two runs of `tpuplex train` with
`model.checkpoint = "smollm2"`: `train.epochs = 0` (the base model, evaluated only) and `--epochs` of full
fine-tuning (AdamW, lr 5e-5, warmup 0.1, batch 8, dropout off); each prints its dev `answer_accuracy` (the share of
dev answers greedy decoding gives token for token, end of turn included) and the answer tokens' loss.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

GLUE = Path(__file__).resolve().parents[2] / "shared" / "glue" / "SST-2"
QUESTION = "Review: {sentence}\nIs this review positive or negative? Answer with one word."


def write_conversations(source: Path, out: Path, rows: int | None) -> None:
    with source.open(encoding="utf-8", newline="") as handle:
        examples = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:rows]
    with out.open("w", encoding="utf-8") as handle:
        for example in examples:
            answer = "positive" if example["label"] == "1" else "negative"
            messages = [{"role": "user", "content": QUESTION.format(sentence=example["sentence"].strip())},
                        {"role": "assistant", "content": answer}]
            handle.write(json.dumps({"messages": messages}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--train-rows", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/smollm2-sst2"))
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} already exists: give a new --out (nothing there is overwritten)")
    args.out.mkdir(parents=True)
    write_conversations(GLUE / "train.tsv", args.out / "train.jsonl", args.train_rows)
    write_conversations(GLUE / "dev.tsv", args.out / "dev.jsonl", None)
    for name, epochs in (("zero-shot", 0), ("fine-tuned", args.epochs)):
        config = args.out / f"{name}.toml"
        config.write_text(f"""[task]
name = "causal_lm"
tokenizer = "checkpoint"
[model]
checkpoint = "smollm2"
dropout = false
[data]
dataset = "sst2"
train_file = "train.jsonl"
eval_files = ["dev.jsonl"]
max_length = 128
[train]
epochs = {epochs}
learning_rate = 5e-5
warmup_ratio = 0.1
global_batch = 8
seed = {args.seed}
[runtime]
output_dir = "{(args.out / name).resolve()}"
""")
        subprocess.run([sys.executable, "-m", "tpuplex", "train", str(config), "--backend", args.backend], check=True)
        dev = json.loads((args.out / name / "results.json").read_text())["metrics"]["dev"]
        print(f"{name}: dev answer_accuracy {dev['answer_accuracy']:.4f}, answer loss {dev['loss']:.4f}", flush=True)


if __name__ == "__main__":
    main()

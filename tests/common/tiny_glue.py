"""Tiny GLUE-format fixtures shared by the test sessions: a tiny BERT checkpoint with a WordPiece tokenizer, tiny
MRPC files, and run configs over them. The tiny MRPC split is built so the label is learnable from the words alone:
a pair is a paraphrase (1) when its second sentence repeats a word of the first. Everything is seeded, so every run
writes the same bytes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from tpuplex.testing.tiny_bert import TINY_CONFIG, write_tiny_bert

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
WORDS = tuple(f"word{i}" for i in range(TINY_CONFIG["vocab_size"] - len(SPECIAL_TOKENS)))
MRPC_HEADER = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"
TRAIN_ROWS, DEV_ROWS = 96, 37  # 37: the last evaluation batch is padded


def write_tiny_tokenizer(directory: Path) -> None:
    """A lowercasing WordPiece tokenizer over `SPECIAL_TOKENS + WORDS` (ids = positions), as tokenizer.json and
    vocab.txt, with BERT's `[CLS] a [SEP] b [SEP]` template and segment ids."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + WORDS)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")


def mrpc_rows(count: int, seed: int) -> list[str]:
    """`count` MRPC rows (label, ids, two sentences of 2-14 words)."""
    rng = np.random.default_rng(seed)
    rows = []
    for index in range(count):
        first = list(rng.choice(WORDS, size=rng.integers(2, 15)))
        second = list(rng.choice(WORDS, size=rng.integers(2, 15)))
        label = int(rng.integers(2))
        if label:
            second[int(rng.integers(len(second)))] = first[0]
        else:
            second = [word for word in second if word not in first] or ["word0" if "word0" not in first else "word1"]
        rows.append(f"{label}\t{2 * index}\t{2 * index + 1}\t{' '.join(first)}\t{' '.join(second)}")
    return rows


def write_mrpc(folder: Path, train: list[str], dev: list[str], header: str = MRPC_HEADER) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("dev", dev)):
        (folder / f"{split}.tsv").write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return folder


def write_tiny_model(directory: Path) -> Path:
    """A tiny random BERT checkpoint (config.json, model.safetensors) with its tokenizer, in `directory`."""
    write_tiny_bert(directory, seed=0)
    write_tiny_tokenizer(directory)
    return directory


def write_tiny_model_reading(directory: Path, tokenizer_dir: Path) -> Path:
    """A tiny random BERT sized for the tokenizer of `tokenizer_dir` (a BERT WordPiece of 30522 tokens, such as
    MiniLM's), with that tokenizer's files: real text becomes real tokens, and a step still takes milliseconds."""
    write_tiny_bert(directory, seed=0, vocab_size=30522, max_position_embeddings=128)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(tokenizer_dir / name, directory / name)
    return directory


def write_tiny_mrpc(folder: Path) -> Path:
    """A tiny MRPC folder: train.tsv (96 rows) and dev.tsv (37 rows) in the original GLUE format."""
    return write_mrpc(folder, mrpc_rows(TRAIN_ROWS, seed=1), mrpc_rows(DEV_ROWS, seed=2))


def write_run_config(folder: Path, model: Path, mrpc: Path, **fields) -> Path:
    """Writes `<folder>/config.toml` for a small run on the tiny model and MRPC (outputs and cache in `folder`);
    keyword arguments (`section__field=value`) change fields. Returns the config path."""
    sections = {
        "model": {"checkpoint": str(model)},
        "data": {"dataset": "mrpc", "data_dir": str(mrpc), "max_length": 32, "buckets": [16, 24],
                 "cache_dir": str(folder / "cache")},
        "train": {"learning_rate": 0.05, "epochs": 2, "global_batch": 8, "warmup_ratio": 0.1, "seed": 7},
        "runtime": {"output_dir": str(folder / "run"), "log_every": 2, "keep_checkpoints": 2},
    }
    for key, value in fields.items():
        section, name = key.split("__")
        sections.setdefault(section, {})[name] = value
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{name} = {json.dumps(value)}" for name, value in values.items())
    path = folder / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def train_losses(output_dir: Path) -> list[tuple[int, float, float]]:
    """(step, loss, learning rate) of every logged training step."""
    entries = (json.loads(line) for line in (output_dir / "log.jsonl").read_text().splitlines())
    return [(entry["step"], entry["loss"], entry["learning_rate"]) for entry in entries if entry["event"] == "train"]

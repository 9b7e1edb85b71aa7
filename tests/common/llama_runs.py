"""A tiny Llama drawn from a config.json, trained by the CLI on the first 20,000 characters of tiny Shakespeare
(character vocabulary, dropout off): the run the mesh's multi-process tests launch (tests/torch/test_fsdp.py,
tests/portable/test_mesh_checkpoints.py)."""

from __future__ import annotations

import json
from pathlib import Path

LLAMA = {"model_type": "llama", "vocab_size": 128, "max_position_embeddings": 64, "hidden_size": 128,
         "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
"""Wide enough for its weights to be split (`tpuplex.sharding.MIN_SHARDED_ELEMENTS`)."""
GEMMA2 = {**LLAMA, "model_type": "gemma2", "head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": 8,
          "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
"""Gemma 2 at that size: every switch the Llama lacks (norms after the sublayers, a window on every other layer,
soft caps, scaled embeddings)."""


def write_llama_run(folder: Path, shared_text: Path, steps: int, checkpoint_every: int, model: dict = LLAMA) -> Path:
    """`<folder>/config.toml` training the Llama (or the decoder `model` describes) for `steps` steps with a
    checkpoint every `checkpoint_every`."""
    (folder / "llama").mkdir()
    (folder / "llama" / "config.json").write_text(json.dumps(model))
    text = (shared_text / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:20_000]
    (folder / "shakespeare.txt").write_text(text, encoding="utf-8")
    (folder / "config.toml").write_text(f"""
[task]
name = "causal_lm"
tokenizer = "characters"
validation_fraction = 0.05
[model]
checkpoint = "llama"
dropout = false
[data]
dataset = "shakespeare"
train_file = "shakespeare.txt"
max_length = 32
cache_dir = "{folder / 'cache'}"
[train]
learning_rate = 1e-3
max_steps = {steps}
global_batch = 8
seed = 5
[runtime]
log_every = 1
checkpoint_every = {checkpoint_every}
keep_checkpoints = 10
host_timeout = 120
""")
    return folder / "config.toml"


def train_losses(run: Path) -> dict[int, float]:
    """The last loss logged for each step (a resumed step's own, not the one a run before it logged)."""
    entries = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return {entry["step"]: entry["loss"] for entry in entries if entry["event"] == "train"}

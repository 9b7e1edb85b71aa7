"""A tiny byte-level tokenizer with SmolLM2's ChatML chat template, and chat .jsonl files: the chat tests' data
(tests/core/test_chat.py, tests/torch/test_decoders.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""SmolLM2's template, less its default system prompt."""
SPECIAL = ["<|im_start|>", "<|im_end|>"]


def write_tokenizer(folder: Path, template: str | None = CHATML) -> Path:
    """A byte-level tokenizer (one token per byte, ChatML's markers whole) with the chat template."""
    folder.mkdir(parents=True, exist_ok=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = Tokenizer(models.BPE({symbol: index for index, symbol in enumerate(sorted(alphabet))}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL])
    tokenizer.save(str(folder / "tokenizer.json"))
    settings = {"eos_token": "<|im_end|>", **({"chat_template": template} if template else {})}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def conversation(question: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}

"""Masked-language-model pre-training (`AutoModelForMaskedLM`): continue (or start) training an encoder on raw text.

    [task]
    name = "masked_lm"
    mask_probability = 0.15         # share of real, non-special tokens the loss is computed on
    validation_fraction = 0.05      # without data.eval_files: the first 5% of the documents are held out
    text_column = "text"            # the column of .jsonl/.csv/.tsv/.parquet files

    [data]
    dataset = "tinyshakespeare"     # a name (runtime.output_dir's {dataset})
    train_file = "input.txt"        # raw text (see tpuplex.tasks.masked_lm.data)
    eval_files = []                 # held-out text files; empty: validation_fraction of train_file

Batches: packed rows [B, max_length] (one compiled training program), masked by the core for every step:
`masked_positions` [B, P] lists each row's chosen positions, labels [B, P] their original ids and weight [B, P]
is 1 on used slots; the head runs on those positions only, and the loss is their cross-entropy.
Metrics of a held-out split (its masks fixed per example): `loss`, `perplexity` (exp of the loss) and `accuracy`
(masked tokens predicted right). The head is each family's MLM head with the decoder tied to the word embeddings
(`heads.py`); `tpuplex export --format hf` writes a folder `AutoModelForMaskedLM` loads, and the same folder is a
checkpoint to fine-tune on any other task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex.collate import Encoded
from tpuplex.errors import TpuplexError
from tpuplex.models import Architecture, Family
from tpuplex.protocol import Batch
from tpuplex.tasks.base import Task, TaskData, check_held_out
from tpuplex.tasks.masked_lm import data as text
from tpuplex.tasks.masked_lm.heads import FAMILY_HEADS, MaskedLMHead, masked_lm_head

EVAL_STREAM = 1
"""Evaluation masks draw from `default_rng([seed, EVAL_STREAM, example])`, training masks from
`default_rng([seed, TRAIN_STREAM, step])`: two streams that never meet."""
TRAIN_STREAM = 0


@dataclasses.dataclass(frozen=True)
class Options:
    mask_probability: float = 0.15
    validation_fraction: float = 0.05
    text_column: str = "text"


@dataclasses.dataclass
class MaskedLMData(TaskData):
    name: str
    train: Encoded
    eval: dict[str, Encoded]
    seed: int
    probability: float
    mask: int
    vocab_size: int
    special: np.ndarray
    per_token: ClassVar[bool] = True

    def train_batch(self, batch: Batch, step: int) -> Batch:
        rng = np.random.default_rng([self.seed, TRAIN_STREAM, step])
        return self._masked(batch, rng)

    def eval_batch(self, batch: Batch, index: np.ndarray) -> Batch:
        # Each example's mask depends on its index alone: the same at every evaluation, whatever the batch size.
        rows = [self._masked({key: value[row : row + 1] for key, value in batch.items()},
                             np.random.default_rng([self.seed, EVAL_STREAM, max(int(example), 0)]))
                for row, example in enumerate(index)]
        return {key: np.concatenate([row[key] for row in rows]) for key in rows[0]}

    def _masked(self, batch: Batch, rng: np.random.Generator) -> Batch:
        return {**batch, **text.mask_tokens(batch["input_ids"], batch["attention_mask"], batch["weight"], rng,
                                            self.probability, self.mask, self.vocab_size, self.special)}

    def metrics(self, split: str, outputs: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> dict[str, float]:
        """outputs [N, P, 2]: each masked position's cross-entropy and whether its prediction is right."""
        total = max(float(weight.sum()), 1.0)
        loss = float((weight * outputs[..., 0]).sum() / total)
        return {"loss": loss, "perplexity": float(np.exp(loss)),
                "accuracy": float((weight * outputs[..., 1]).sum() / total)}


class MaskedLM(Task):
    name: ClassVar[str] = "masked_lm"
    Options: ClassVar[type] = Options
    backends: ClassVar[Mapping[str, str]] = {backend: f"{__name__}.{backend}" for backend in ("jax", "tf", "torch")}
    auto_class: ClassVar[str] = "AutoModelForMaskedLM"

    def check(self, config: Any, options: Options) -> None:
        if not 0 < options.mask_probability < 1:
            raise TpuplexError(f"task.mask_probability = {options.mask_probability} is not allowed: use a number "
                               "in (0, 1), e.g. 0.15")
        check_held_out(config, options.validation_fraction, self.name, "text", 0.05)
        if not config.data.train_file:
            raise TpuplexError("data.train_file is empty: the masked_lm task trains on raw text, e.g. "
                               'train_file = "corpus.txt"')
        text.text_file("data.train_file", config.data.train_file)
        for index, spec in enumerate(config.data.eval_files):
            text.text_file(f"data.eval_files[{index}]", spec)

    def prepare(self, config: Any, options: Options, tokenizer_dir: Path) -> MaskedLMData:
        data = config.data
        tokenizer = text.untruncated_tokenizer(tokenizer_dir, data.max_length)
        mask = text.mask_id(tokenizer, tokenizer_dir)
        train_file = text.text_file("data.train_file", data.train_file)
        documents = text.documents(train_file, options.text_column)
        held_out: dict[str, list[str]] = {}
        if data.eval_files:
            for index, spec in enumerate(data.eval_files):
                file = text.text_file(f"data.eval_files[{index}]", spec)
                held_out[file.name] = text.documents(file, options.text_column)
        else:  # HF run_mlm's validation_split_percentage: the first share of the documents
            count = max(1, int(len(documents) * options.validation_fraction))
            if count >= len(documents):
                raise TpuplexError(f"{train_file.path} has {len(documents)} documents: too few to hold out "
                                   f"task.validation_fraction = {options.validation_fraction} and train on the rest")
            held_out["validation"], documents = documents[:count], documents[count:]
        cache = Path(data.cache_dir).expanduser()
        train = text.packed_cached(documents, tokenizer, tokenizer_dir, data.max_length, cache, f"{train_file.path}")
        evaluation = {split: text.packed_cached(texts, tokenizer, tokenizer_dir, data.max_length, cache,
                                                f"held-out {split}") for split, texts in held_out.items()}
        return MaskedLMData(data.dataset, train, evaluation, seed=config.train.seed,
                            probability=options.mask_probability, mask=mask,
                            vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
                            special=text.special_ids(tokenizer))

    def head(self, family: Family | None, arch: Architecture | None, hf_config: Mapping[str, Any],
             data: MaskedLMData) -> MaskedLMHead:
        return masked_lm_head(family, arch)

    def hf_class(self, family: Family, model_type: str) -> str:
        return FAMILY_HEADS[family.name].hf_classes[family.model_types.index(model_type)]


TASK = MaskedLM()

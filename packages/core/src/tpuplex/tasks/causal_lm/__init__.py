"""Causal language modelling (`AutoModelForCausalLM`): train a decoder (GPT-2, Llama) to predict the next token.

    [task]
    name = "causal_lm"
    tokenizer = "characters"        # or "checkpoint": the model folder's tokenizer.json (GPT-2's BPE, ...)
    validation_fraction = 0.1       # without data.eval_files: the last 10% of the tokens are held out (nanoGPT's)
    sampling = "epochs"             # or "random_windows": nanoGPT's get_batch (see below)
    text_column = "text"            # the column of .jsonl/.csv/.tsv/.parquet files

    [data]
    train_file = "input.txt"        # a .txt file is one document; tables give one per row (see data.py);
                                    # or a folder `tpuplex prepare --task causal_lm` wrote (a corpus of any size)
    max_length = 256                # the context: rows of 256 inputs and 256 targets

Batches: input_ids [B, L], labels [B, L] (the next token of each), weight [B, L] (0 on padding). Training takes
every token once per epoch (`sampling = "epochs"`), or, as nanoGPT's `get_batch` does, B windows of L + 1 tokens at
uniformly random offsets of the training stream each step (`"random_windows"`, drawn from (seed, step), so every
backend and a resumed run see the same windows). Evaluation predicts every held-out token once: a split's `loss`
(mean cross-entropy per token), `perplexity` (its exp) and `accuracy` (the most likely token right) count each of
its tokens exactly once. A prepared training corpus without `data.eval_files` holds out its last rows
(`validation_fraction` of them). The character vocabulary a run builds is recorded in run.json (`characters`), so eval,
generate and export read text as the run did. `tpuplex generate RUN --prompt TEXT` continues a prompt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex.data.shards import is_prepared
from tpuplex.data.tables import text_file
from tpuplex.errors import TpuplexError
from tpuplex.models import Architecture, Family
from tpuplex.protocol import Batch
from tpuplex.tasks.base import Head, Task, TaskData, check_held_out, framework_modules, token_metrics
from tpuplex.tasks.causal_lm import data as text
from tpuplex.tasks.causal_lm.data import Characters, CheckpointTokenizer, CorpusEncoder, NextTokenRows, Vocabulary

TOKENIZERS = ("characters", "checkpoint")
SAMPLINGS = ("epochs", "random_windows")


@dataclasses.dataclass(frozen=True)
class Options:
    tokenizer: str = "checkpoint"
    validation_fraction: float = 0.1
    sampling: str = "epochs"
    text_column: str = "text"
    characters: str = ""
    """The character vocabulary (tokenizer = "characters"): built from data.train_file when empty; recorded."""


@dataclasses.dataclass
class CausalLMData(TaskData):
    name: str
    train: NextTokenRows
    eval: dict[str, NextTokenRows]
    vocabulary: Vocabulary
    windows: NextTokenRows | None = None
    """The training stream when training on random windows of it, else None."""
    seed: int = 0
    per_token: ClassVar[bool] = True

    def train_batch(self, batch: Batch, step: int) -> Batch:
        if self.windows is None:
            return text.next_token_rows(batch)
        return text.random_windows(self.windows, *batch["input_ids"].shape, np.random.default_rng([self.seed, step]))

    def eval_batch(self, batch: Batch, index: np.ndarray) -> Batch:
        return text.next_token_rows(batch)

    def metrics(self, split: str, outputs: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> dict[str, float]:
        """outputs [N, P, 2]: each position's cross-entropy and whether its most likely token is the target."""
        return token_metrics(outputs, weight)

    def pinned_options(self) -> dict[str, Any]:
        return {"characters": self.vocabulary.characters} if isinstance(self.vocabulary, Characters) else {}


class CausalLM(Task):
    name: ClassVar[str] = "causal_lm"
    Options: ClassVar[type] = Options
    backends: ClassVar[Mapping[str, str]] = framework_modules(__name__)
    auto_class: ClassVar[str] = "AutoModelForCausalLM"
    model_kinds: ClassVar[tuple[str, ...]] = ("decoder",)
    inputs: ClassVar[tuple[str, ...]] = ("input_ids",)

    def check(self, config: Any, options: Options) -> None:
        if options.tokenizer not in TOKENIZERS:
            raise TpuplexError(f"task.tokenizer = {options.tokenizer!r} is not a tokenizer: use \"characters\" (built "
                               "from the training text) or \"checkpoint\" (the model folder's tokenizer.json)")
        check_held_out(config, options.validation_fraction, self.name, "text", 0.1)
        if options.sampling not in SAMPLINGS:
            raise TpuplexError(f"task.sampling = {options.sampling!r} is not a sampling: use \"epochs\" (every token "
                               "once per epoch) or \"random_windows\" (nanoGPT's random offsets each step)")
        if not config.data.train_file:
            raise TpuplexError("data.train_file is empty: the causal_lm task trains on raw text, e.g. "
                               'train_file = "input.txt"')
        for index, spec in enumerate((config.data.train_file, *config.data.eval_files)):
            field = "data.train_file" if index == 0 else f"data.eval_files[{index - 1}]"
            if not is_prepared(spec):
                text_file(field, spec)
            elif options.tokenizer != "checkpoint":
                raise TpuplexError(f"{field} = {spec!r} is a prepared corpus, tokenized with a checkpoint's "
                                   'tokenizer: set task.tokenizer = "checkpoint"')

    def vocabulary(self, options: Options, train_texts: list[str], tokenizer_dir: Path) -> Vocabulary:
        if options.tokenizer == "checkpoint":
            return CheckpointTokenizer(tokenizer_dir)
        return Characters(options.characters) if options.characters else Characters.of(train_texts)

    def prepare(self, config: Any, options: Options, tokenizer_dir: Path) -> CausalLMData:
        data, length = config.data, config.data.max_length
        if is_prepared(data.train_file):
            vocabulary = CheckpointTokenizer(tokenizer_dir)
            source = text.prepared_corpus("data.train_file", data.train_file, tokenizer_dir, length)
            train, train_ids, what = text.NextTokenRows(source), None, data.train_file
        else:
            train_file = text_file("data.train_file", data.train_file)
            train_texts = text.documents(train_file, options.text_column)
            vocabulary = self.vocabulary(options, train_texts, tokenizer_dir)
            train_ids, what = text.stream(train_texts, vocabulary, str(train_file.path)), str(train_file.path)
        evaluation = {}
        for index, spec in enumerate(data.eval_files):
            field = f"data.eval_files[{index}]"
            if is_prepared(spec):
                evaluation[Path(spec).name] = NextTokenRows(text.prepared_corpus(field, spec, tokenizer_dir, length))
            else:
                file = text_file(field, spec)
                ids = text.stream(text.documents(file, options.text_column), vocabulary, str(file.path))
                evaluation[file.name] = text.next_token_stream(ids, length, str(file.path))
        held_out = f"the held-out last {options.validation_fraction:.0%} of {what}"
        if not evaluation and train_ids is not None:  # nanoGPT's split: the first share trains, the rest is held out
            cut = int(len(train_ids) * (1 - options.validation_fraction))
            evaluation["validation"] = text.next_token_stream(train_ids[cut:], length, held_out)
            train_ids = train_ids[:cut]
        elif not evaluation:  # a prepared corpus: its last rows
            cut = int(len(train.source) * (1 - options.validation_fraction))
            if not 0 < cut < len(train.source):
                raise TpuplexError(f"{what} has {len(train.source)} rows: too few to hold out "
                                   f"task.validation_fraction = {options.validation_fraction} and train on the rest")
            train, evaluation["validation"] = NextTokenRows(train.source, 0, cut), NextTokenRows(train.source, cut)
        if train_ids is not None:
            train = text.next_token_stream(train_ids, length, what)
        windows = train if options.sampling == "random_windows" else None
        return CausalLMData(data.dataset, train, evaluation, vocabulary, windows, config.train.seed)

    def corpus_encoder(self, tokenizer_dir: Path) -> CorpusEncoder:
        return CorpusEncoder(str(tokenizer_dir))

    def example_batch(self, data: TaskData | None) -> dict[str, np.ndarray]:
        return {"input_ids": np.zeros((2, 8), np.int32), "labels": np.zeros((2, 8), np.int32)}

    def head_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        """0: the LM head is the decoder's (`DecoderArch.forward_flops`)."""
        return 0.0

    def head(self, family: Family | None, arch: Architecture | None, hf_config: Mapping[str, Any],
             data: CausalLMData) -> Head:
        """None beyond the family's own LM head (`tpuplex.kinds.decoder`)."""
        return Head(modules={}, shapes={}, drawn=())


TASK = CausalLM()

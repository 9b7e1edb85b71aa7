"""T5's pre-training objective (`span_corruption`): an encoder-decoder (`tpuplex.kinds.encoder_decoder`) reads raw
text with spans of it replaced by sentinel tokens and writes the spans back, as T5 was trained on TPUs and HF's
`run_t5_mlm_flax.py` trains it.

    [task]
    name = "span_corruption"
    noise_density = 0.15            # T5's: the share of each row's tokens that are noise
    mean_span_length = 3.0          # T5's: the mean length of a noise span
    validation_fraction = 0.05      # without data.eval_files: the first 5% of the lines held out (run_t5_mlm_flax's)
    tokenizer_vocab_size = 8000     # `tpuplex prepare CONFIG` trains a T5 tokenizer of this size on data.train_file
                                    # into model.checkpoint when it has none (run_t5_mlm_flax's first step)

    [data]
    train_file = "input.txt"        # each non-blank line a text (or a table's text_column)
    max_length = 128                # the encoder's inputs: rows of 141 tokens corrupt into 128 inputs and 29 targets

Every text is tokenized with end-of-text after it, the texts concatenated and cut into rows of `tokens_length`
(`tpuplex.data.span_corruption.input_and_target_lengths` of data.max_length), the tail dropped (`group_texts`).
Each training batch is corrupted afresh from (seed, step) (`tpuplex.data.span_corruption.corrupt`), so every backend
and a resumed run see the same rows; an evaluation batch from (seed, its first row), the same at every evaluation.
Batches: input_ids [B, S] (no padding: attention_mask all 1), decoder_input_ids, labels, weight [B, T].
Evaluation: `loss` per target token, its `perplexity` and `accuracy` (the most likely token right).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex.data import span_corruption, t5_tokenizer
from tpuplex.data.batching import Encoded
from tpuplex.data.tables import text_file
from tpuplex.errors import DataError, TpuplexError
from tpuplex.models import Architecture, Family
from tpuplex.models.t5 import INPUTS, shift_right
from tpuplex.protocol import Batch
from tpuplex.tasks.base import (
    TOKEN_METRICS,
    Head,
    Task,
    TaskData,
    check_held_out,
    check_split_names,
    evaluation_splits,
    framework_modules,
    token_metrics,
)
from tpuplex.tasks.causal_lm.data import CheckpointTokenizer, documents


@dataclasses.dataclass(frozen=True)
class Options:
    noise_density: float = span_corruption.NOISE_DENSITY
    mean_span_length: float = span_corruption.MEAN_SPAN_LENGTH
    validation_fraction: float = 0.05
    text_column: str = "text"
    tokenizer_vocab_size: int = 8000


@dataclasses.dataclass
class SpanCorruptionData(TaskData):
    name: str
    train: Encoded | None
    eval: dict[str, Encoded]
    vocabulary: CheckpointTokenizer
    sentinels: np.ndarray
    options: Options
    seed: int
    per_token: ClassVar[bool] = True

    def train_batch(self, batch: Batch, step: int) -> Batch:
        return self.corrupted(batch, np.random.default_rng([self.seed, step]))

    def eval_batch(self, batch: Batch, index: np.ndarray) -> Batch:
        return self.corrupted(batch, np.random.default_rng([self.seed, 1 << 30, max(int(index[0]), 0)]))

    def corrupted(self, batch: Batch, rng: np.random.Generator) -> Batch:
        """The Batcher's rows of raw tokens [B, tokens_length] (weight [B]) corrupted: input_ids, attention_mask
        [B, S], decoder_input_ids, labels and weight [B, T]."""
        eos = self.vocabulary.end_of_text
        inputs, labels = span_corruption.corrupt(np.asarray(batch["input_ids"]), self.sentinels, eos, rng,
                                                 self.options.noise_density, self.options.mean_span_length)
        weight = np.broadcast_to(np.asarray(batch["weight"], np.float32)[:, None], labels.shape)
        return {"input_ids": inputs.astype(np.int32), "attention_mask": np.ones_like(inputs, np.int32),
                "decoder_input_ids": shift_right(labels.astype(np.int32), 0), "labels": labels.astype(np.int32),
                "weight": np.ascontiguousarray(weight)}

    def metrics(self, split: str, outputs: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> dict[str, float]:
        return token_metrics(outputs, weight)

    def vocabulary_size(self) -> int:
        return self.vocabulary.size


class SpanCorruption(Task):
    name: ClassVar[str] = "span_corruption"
    Options: ClassVar[type] = Options
    backends: ClassVar[Mapping[str, str]] = framework_modules("seq2seq")  # seq2seq's losses
    auto_class: ClassVar[str] = "AutoModelForSeq2SeqLM"
    model_kinds: ClassVar[tuple[str, ...]] = ("encoder_decoder",)
    inputs: ClassVar[tuple[str, ...]] = INPUTS

    def check(self, config: Any, options: Options) -> None:
        check_held_out(config, options.validation_fraction, self.name, "text", 0.05)
        if not config.data.train_file:
            raise TpuplexError("data.train_file is empty: the span_corruption task trains on raw text, e.g. "
                               'train_file = "input.txt"')
        for index, spec in enumerate((config.data.train_file, *config.data.eval_files)):
            text_file("data.train_file" if index == 0 else f"data.eval_files[{index - 1}]", spec)
        span_corruption.input_and_target_lengths(config.data.max_length, options.noise_density,
                                                 options.mean_span_length)  # bad settings refused before reading

    def metric_names(self, config: Any, options: Options) -> dict[str, tuple[str, ...]]:
        return dict.fromkeys(evaluation_splits(config, lambda field, spec: text_file(field, spec).name), TOKEN_METRICS)

    def prepare_checkpoint(self, config: Any, options: Options, checkpoint_dir: Path) -> str | None:
        """`tpuplex prepare CONFIG`: a T5 tokenizer of task.tokenizer_vocab_size trained on data.train_file's
        texts into model.checkpoint when it has none (nothing there is replaced)."""
        if (checkpoint_dir / "tokenizer.json").is_file():
            return None
        texts = self._texts(config, options, "data.train_file", config.data.train_file)
        t5_tokenizer.train_t5_tokenizer(texts, options.tokenizer_vocab_size, checkpoint_dir)
        return f"a T5 tokenizer of {options.tokenizer_vocab_size} ids trained on {config.data.train_file}"

    def model_data(self, config: Any, options: Options, tokenizer_dir: Path) -> SpanCorruptionData:
        """Generation reads no text: the checkpoint's tokenizer."""
        return SpanCorruptionData(config.data.dataset, None, {}, CheckpointTokenizer(tokenizer_dir),
                                  np.asarray(t5_tokenizer.sentinel_ids(tokenizer_dir), np.int64), options,
                                  config.train.seed)

    def prepare(self, config: Any, options: Options, tokenizer_dir: Path) -> SpanCorruptionData:
        if not (tokenizer_dir / "tokenizer.json").is_file():
            raise DataError(f"model.checkpoint {tokenizer_dir} has no tokenizer.json: `tpuplex prepare CONFIG` "
                            "trains a T5 tokenizer with its sentinels there on data.train_file "
                            "(task.tokenizer_vocab_size ids), or give a T5 checkpoint with its tokenizer")
        sentinels = np.asarray(t5_tokenizer.sentinel_ids(tokenizer_dir), np.int64)
        vocabulary = CheckpointTokenizer(tokenizer_dir)
        if vocabulary.end_of_text is None:
            raise DataError(f"the tokenizer in {tokenizer_dir} has no end-of-text token (</s>): give a T5 tokenizer")
        tokens_length, _ = span_corruption.input_and_target_lengths(config.data.max_length, options.noise_density,
                                                                    options.mean_span_length)
        names = [text_file(f"data.eval_files[{index}]", spec).name for index, spec in enumerate(config.data.eval_files)]
        check_split_names(config.data.eval_files, names)
        texts = self._texts(config, options, "data.train_file", config.data.train_file)
        evaluation = {}
        if config.data.eval_files:
            for index, (spec, name) in enumerate(zip(config.data.eval_files, names, strict=True)):
                field = f"data.eval_files[{index}]"
                evaluation[name] = _rows(self._texts(config, options, field, spec), vocabulary, tokens_length,
                                         f"{field} {spec}")
        else:  # run_t5_mlm_flax's split: the first share of the texts is held out
            cut = int(len(texts) * options.validation_fraction)
            evaluation["validation"] = _rows(texts[:cut], vocabulary, tokens_length,
                                             f"the first {options.validation_fraction:.0%} of {config.data.train_file}")
            texts = texts[cut:]
        train = _rows(texts, vocabulary, tokens_length, f"data.train_file {config.data.train_file}")
        return SpanCorruptionData(config.data.dataset, train, evaluation, vocabulary, sentinels, options,
                                  config.train.seed)

    @staticmethod
    def _texts(config: Any, options: Options, field: str, spec: str) -> list[str]:
        """The texts of a .txt file (its non-blank lines: `datasets`' text loader, which run_t5_mlm_flax.py reads
        with, keeps a blank line as an empty text, an end-of-text alone) or of a table's text column."""
        file = text_file(field, spec)
        if file.path.suffix == ".txt":
            lines = [line for line in file.path.read_text(encoding="utf-8").splitlines() if line.strip()]
            if not lines:
                raise DataError(f"{field} = {spec!r} has no text: give a file with some")
            return lines
        return documents(file, options.text_column)

    def example_batch(self, data: TaskData | None) -> dict[str, np.ndarray]:
        return {"input_ids": np.zeros((2, 8), np.int32), "attention_mask": np.ones((2, 8), np.int32),
                "decoder_input_ids": np.zeros((2, 4), np.int32), "labels": np.zeros((2, 4), np.int32)}

    def head(self, family: Family | None, arch: Architecture | None, hf_config: Mapping[str, Any],
             data: SpanCorruptionData) -> Head:
        return Head(modules={}, shapes={}, drawn=())

    def head_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        return 0.0

    def hf_class(self, family: Family, model_type: str) -> str:
        return family.hf_class


def _rows(texts: list[str], vocabulary: CheckpointTokenizer, tokens_length: int, what: str) -> Encoded:
    """Every text's tokens and end-of-text, concatenated, cut into rows of tokens_length (the tail dropped)."""
    eos = np.asarray([vocabulary.end_of_text], np.int32)
    stream = np.concatenate([part for text in texts for part in (vocabulary.encode(text, what), eos)] or [eos])
    rows = len(stream) // tokens_length
    if rows == 0:
        raise DataError(f"{what} has {len(stream)} tokens, fewer than one row of {tokens_length}: give more text, "
                        "or a smaller data.max_length")
    ids = stream[:rows * tokens_length].reshape(rows, tokens_length).astype(np.int32)
    return Encoded(ids, np.zeros_like(ids), np.full(rows, tokens_length, np.int32), np.zeros(rows, np.int32))


TASK = SpanCorruption()

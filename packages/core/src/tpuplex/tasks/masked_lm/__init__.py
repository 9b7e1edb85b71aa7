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
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex.data.batching import Encoded
from tpuplex.data.corpus import SUFFIXES as CORPUS_SUFFIXES
from tpuplex.data.corpus import cached_corpus, document_count
from tpuplex.data.prepared_tokens import PreparedTokens, open_tokens
from tpuplex.data.shards import is_prepared
from tpuplex.data.tables import DataFile, text_file
from tpuplex.data.tokenize import tokenizer_hash
from tpuplex.errors import TpuplexError
from tpuplex.models import Architecture, Family
from tpuplex.protocol import Batch
from tpuplex.tasks.base import (
    TOKEN_METRICS,
    Task,
    TaskData,
    check_held_out,
    check_split_names,
    evaluation_splits,
    framework_modules,
    matmul_weights,
    token_metrics,
)
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
        return token_metrics(outputs, weight)


class MaskedLM(Task):
    name: ClassVar[str] = "masked_lm"
    Options: ClassVar[type] = Options
    backends: ClassVar[Mapping[str, str]] = framework_modules(__name__)
    auto_class: ClassVar[str] = "AutoModelForMaskedLM"

    def check(self, config: Any, options: Options) -> None:
        if not 0 < options.mask_probability < 1:
            raise TpuplexError(f"task.mask_probability = {options.mask_probability} is not allowed: use a number "
                               "in (0, 1), e.g. 0.15")
        check_held_out(config, options.validation_fraction, self.name, "text", 0.05)
        if not config.data.train_file:
            raise TpuplexError("data.train_file is empty: the masked_lm task trains on raw text, e.g. "
                               'train_file = "corpus.txt"')
        if is_prepared(config.data.train_file):
            if not config.data.eval_files:
                raise TpuplexError(f"data.train_file = {config.data.train_file!r} is a prepared corpus, from which "
                                   "no documents can be held out: set data.eval_files (text or prepared)")
        else:
            text_file("data.train_file", config.data.train_file)
        for index, spec in enumerate(config.data.eval_files):
            if not is_prepared(spec):
                text_file(f"data.eval_files[{index}]", spec)

    def metric_names(self, config: Any, options: Options) -> dict[str, tuple[str, ...]]:
        splits = evaluation_splits(config, lambda field, spec: Path(spec).name if is_prepared(spec)
                                   else text_file(field, spec).name)
        return dict.fromkeys(splits, TOKEN_METRICS)

    def prepare(self, config: Any, options: Options, tokenizer_dir: Path) -> MaskedLMData:
        data = config.data
        tokenizer = text.untruncated_tokenizer(tokenizer_dir, data.max_length)
        mask = text.mask_id(tokenizer, tokenizer_dir)
        cache = Path(data.cache_dir).expanduser()
        encoder = text.CorpusEncoder(str(tokenizer_dir))

        fingerprint = functools.cache(lambda file: file.fingerprint())  # one pass over a file shared by two splits

        def packed(file: DataFile, what: str, documents: tuple[int, int] | None = None,
                   texts: list[str] | None = None) -> PreparedTokens:
            """A .txt/.jsonl corpus (its documents [first, stop) when given) streamed through `prepare`'s code into
            the cache; a table's documents (`texts`, read if not given) packed through the cache."""
            if file.path.suffix in CORPUS_SUFFIXES:
                return cached_corpus(str(file.path), cache, f"masked_lm-{file.path.stem}", fingerprint(file), encoder,
                                     data.max_length, options.text_column, documents)
            texts = text.documents(file, options.text_column) if texts is None else texts
            if documents is not None:
                texts = texts[slice(*documents)]
            return text.packed_cached(texts, tokenizer, tokenizer_dir, data.max_length, cache, what)

        def split(field: str, spec: str) -> PreparedTokens:
            if is_prepared(spec):
                return prepared_corpus(field, spec, tokenizer_dir, data.max_length)
            return packed(text_file(field, spec), f"{field} {spec}")

        names = [Path(spec).name if is_prepared(spec) else text_file(f"data.eval_files[{index}]", spec).name
                 for index, spec in enumerate(data.eval_files)]
        check_split_names(data.eval_files, names)
        evaluation = {name: split(f"data.eval_files[{index}]", spec)
                      for index, (spec, name) in enumerate(zip(data.eval_files, names, strict=True))}
        if evaluation or is_prepared(data.train_file):
            train = split("data.train_file", data.train_file)
        else:  # HF run_mlm's validation_split_percentage: the first share of the documents
            train_file = text_file("data.train_file", data.train_file)
            texts = None if train_file.path.suffix in CORPUS_SUFFIXES else text.documents(train_file,
                                                                                        options.text_column)
            total = document_count(str(train_file.path), encoder, options.text_column) if texts is None else len(texts)
            if not total:
                raise TpuplexError(f"{train_file.path} has no text (data.train_file): give a file with at least one "
                                   "non-blank line")
            count = max(1, int(total * options.validation_fraction))
            if count >= total:
                raise TpuplexError(f"{train_file.path} has {total} documents: too few to hold out "
                                   f"task.validation_fraction = {options.validation_fraction} and train on the rest")
            evaluation["validation"] = packed(train_file, f"held-out {data.train_file}", (0, count), texts)
            train = packed(train_file, f"data.train_file {data.train_file}", (count, total), texts)
        return MaskedLMData(data.dataset, train, evaluation, seed=config.train.seed,
                            probability=options.mask_probability, mask=mask,
                            vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
                            special=text.special_ids(tokenizer))

    def head(self, family: Family | None, arch: Architecture | None, hf_config: Mapping[str, Any],
             data: MaskedLMData) -> MaskedLMHead:
        return masked_lm_head(family, arch)

    def head_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        """The transform and the (tied) decoder over the vocabulary, at the masked positions only."""
        head = spec.head
        return 2.0 * np.size(batch["masked_positions"]) * (matmul_weights(head.shapes)
                                                          + head.embedding_size * head.vocab_size)

    def hf_class(self, family: Family, model_type: str) -> str:
        return FAMILY_HEADS[family.name].hf_classes[family.model_types.index(model_type)]

    def corpus_encoder(self, tokenizer_dir: Path) -> text.CorpusEncoder:
        return text.CorpusEncoder(str(tokenizer_dir))


def prepared_corpus(field: str, spec: str, tokenizer_dir: Path, max_length: int) -> PreparedTokens:
    """A corpus `tpuplex prepare` packed (`corpus.prepare_corpus`), checked against the run's tokenizer and
    max_length."""
    prepared = open_tokens(spec)
    meta = prepared.shards.meta
    if not meta.get("packed") or meta.get("task", text.TASK) != text.TASK:
        raise TpuplexError(f"{field} = {spec!r} is a prepared folder but not a masked-LM corpus: prepare the text "
                           "with tpuplex prepare FILES --tokenizer CHECKPOINT --max-length N")
    if meta["max_length"] != max_length:
        raise TpuplexError(f"{field} = {spec!r} was packed into rows of {meta['max_length']} tokens, but "
                           f"data.max_length is {max_length}: set data.max_length = {meta['max_length']} or prepare "
                           "the corpus again")
    if meta["tokenizer"] != tokenizer_hash(tokenizer_dir):
        raise TpuplexError(f"{field} = {spec!r} was tokenized with another tokenizer than {tokenizer_dir}'s: prepare "
                           "it again with --tokenizer set to the run's checkpoint")
    return prepared


TASK = MaskedLM()

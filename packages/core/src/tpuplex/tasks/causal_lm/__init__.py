"""Causal language modelling (`AutoModelForCausalLM`): train a decoder (`models.DECODER_FAMILIES`) to predict the next
token.

    [task]
    name = "causal_lm"
    tokenizer = "characters"        # or "checkpoint": the model folder's tokenizer.json (GPT-2's BPE, ...)
    validation_fraction = 0.1       # without data.eval_files: the last 10% of the tokens are held out (nanoGPT's)
    sampling = "epochs"             # or "random_windows": nanoGPT's get_batch (see below)
    text_column = "text"            # the column of .jsonl/.csv/.tsv/.parquet files
    prompt_template = ""            # with answer_template: each row of a table a conversation (see chat.py)

    [data]
    train_file = "input.txt"        # a .txt file is one document; tables give one per row (see data.py);
                                    # or a folder `tpuplex prepare --task causal_lm` wrote (a corpus of any size)
    max_length = 256                # the context: rows of 256 inputs and 256 targets

Batches: input_ids [B, L], labels [B, L] (the next token of each), weight [B, L] (0 on padding). Training takes
every token once per epoch (`sampling = "epochs"`), or, as nanoGPT's `get_batch` does, B windows of L + 1 tokens at
uniformly random offsets of the training stream each step (`"random_windows"`, drawn from (seed, step), so every
backend and a resumed run see the same windows). Evaluation predicts every held-out token once: a split's `loss`
(mean cross-entropy per token), `perplexity` (its exp) and `accuracy` (the most likely token right) count each of
its tokens exactly once. Without `data.eval_files`, the last `validation_fraction` of the training stream's tokens
is held out, whatever the file's form. A .txt or .jsonl file streams through `tpuplex prepare`'s code into
`data.cache_dir` (a run's memory does not grow with its corpus). The character vocabulary a run builds is recorded
in run.json (`characters`), so eval, generate and export read text as the run did. `tpuplex generate RUN --prompt
TEXT` continues a prompt.
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
from tpuplex.data.corpus import pack_stream
from tpuplex.data.shards import is_prepared
from tpuplex.data.tables import resolve_file, text_file
from tpuplex.errors import TpuplexError
from tpuplex.models import Architecture, Family
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
from tpuplex.tasks.causal_lm import chat
from tpuplex.tasks.causal_lm import data as text
from tpuplex.tasks.causal_lm.data import (
    Characters,
    CheckpointTokenizer,
    CorpusEncoder,
    NextTokenRows,
    Vocabulary,
    WindowSlots,
)

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
    prompt_template: str = ""
    answer_template: str = ""
    """jinja2 templates over a table's columns making each row a conversation (`chat.table_records`): the user's
    message and the assistant's answer, e.g. "Review: {{ sentence }}" and "{{ ['negative', 'positive'][label |
    int] }}". Both or neither."""


@dataclasses.dataclass
class CausalLMData(TaskData):
    name: str
    train: NextTokenRows | None
    eval: dict[str, NextTokenRows]
    vocabulary: Vocabulary
    windows: NextTokenRows | None = None
    """The training stream when training on random windows of it, else None."""
    seed: int = 0
    answer_width: int = 0
    """Conversations (`chat`: each a row of its own, the loss on its answers alone): the most answer targets one
    has (`chat.answer_width`); 0: text."""
    per_token: ClassVar[bool] = True

    def train_batch(self, batch: Batch, step: int) -> Batch:
        if self.answer_width:
            return chat.answer_rows(batch, self.answer_width)
        if self.windows is None:
            return text.next_token_rows(batch)
        return text.random_windows(self.windows, *batch["input_ids"].shape, np.random.default_rng([self.seed, step]))

    def eval_batch(self, batch: Batch, index: np.ndarray) -> Batch:
        return chat.answer_rows(batch, self.answer_width) if self.answer_width else text.next_token_rows(batch)

    def metrics(self, split: str, outputs: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> dict[str, float]:
        """outputs [N, P, 2]: each position's cross-entropy and whether its most likely token is the target.
        Conversations add `answer_accuracy` (`chat.answer_accuracy`)."""
        metrics = token_metrics(outputs, weight)
        return {**metrics, "answer_accuracy": chat.answer_accuracy(outputs, weight)} if self.answer_width else metrics

    def vocabulary_size(self) -> int:
        return self.vocabulary.size

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
        if bool(options.prompt_template) != bool(options.answer_template):
            raise TpuplexError("task.prompt_template and task.answer_template make a table's rows conversations "
                               "together: set both (the user's message and the answer), or neither")
        if options.prompt_template and chat.is_chat(Path(config.data.train_file).expanduser()):
            # Read as a table, its records have no columns for the templates to read: "no examples", said wrongly.
            raise TpuplexError(f"data.train_file = {config.data.train_file!r} holds conversations already: remove "
                               "task.prompt_template and task.answer_template (they make a table's rows "
                               "conversations)")
        if self.conversations(config, options):
            if options.tokenizer != "checkpoint" or options.sampling != "epochs":
                raise TpuplexError(f"data.train_file = {config.data.train_file!r} holds conversations: they train "
                                   'with task.tokenizer = "checkpoint" and task.sampling = "epochs"')
            return
        for index, spec in enumerate((config.data.train_file, *config.data.eval_files)):
            field = "data.train_file" if index == 0 else f"data.eval_files[{index - 1}]"
            if not is_prepared(spec):
                text_file(field, spec)
            elif options.tokenizer != "checkpoint":
                raise TpuplexError(f"{field} = {spec!r} is a prepared corpus, tokenized with a checkpoint's "
                                   'tokenizer: set task.tokenizer = "checkpoint"')

    @staticmethod
    def conversations(config: Any, options: Options) -> bool:
        """Whether the run trains on conversations: a table with task.prompt_template, or a chat .jsonl."""
        return bool(options.prompt_template) or chat.is_chat(Path(config.data.train_file).expanduser())

    def metric_names(self, config: Any, options: Options) -> dict[str, tuple[str, ...]]:
        """`loss`, `perplexity` and `accuracy` on each held-out split (conversations: and `answer_accuracy`)."""
        if not self.conversations(config, options):
            splits = evaluation_splits(config, lambda field, spec: Path(spec).name if is_prepared(spec)
                                       else text_file(field, spec).name)
            return dict.fromkeys(splits, TOKEN_METRICS)
        splits = evaluation_splits(config, lambda field, spec: resolve_file(field, spec).name
                                   if options.prompt_template else Path(spec).stem)
        return dict.fromkeys(splits, (*TOKEN_METRICS, "answer_accuracy"))

    def prepare(self, config: Any, options: Options, tokenizer_dir: Path) -> CausalLMData:
        if self.conversations(config, options):
            return self._prepare_conversations(config, options, tokenizer_dir)
        data, length = config.data, config.data.max_length
        fingerprint = functools.cache(lambda file: file.fingerprint())  # one pass over a file read twice
        census = functools.cache(lambda file: text.census(file, options.text_column))

        def read(field: str, spec: str, vocabulary: Vocabulary | None) -> tuple[NextTokenRows, Vocabulary]:
            """A split's whole stream, and the vocabulary (the one given, else the checkpoint's or built from it)."""
            if is_prepared(spec):
                prepared = text.prepared_corpus(field, spec, tokenizer_dir, length)
                return NextTokenRows(prepared), vocabulary or CheckpointTokenizer(tokenizer_dir)
            file = text_file(field, spec)
            streamed = file.path.suffix in CORPUS_SUFFIXES
            texts = None if streamed else text.documents(file, options.text_column)
            if vocabulary is None and options.tokenizer == "checkpoint":
                vocabulary = CheckpointTokenizer(tokenizer_dir)
            elif vocabulary is None:
                vocabulary = Characters(options.characters or (census(file)[1] if streamed else
                                                               Characters.of(texts).characters))
            if not streamed:
                return NextTokenRows(pack_stream(text.stream(texts, vocabulary, str(file.path)), length)), vocabulary
            documents = census(file)[0]  # and a file of blank lines stops here, as a table of them does
            return NextTokenRows(text.cached_stream(file, vocabulary, documents, tokenizer_dir, length,
                                                    Path(data.cache_dir).expanduser(), options.text_column,
                                                    fingerprint(file))), vocabulary

        names = [Path(spec).name if is_prepared(spec) else text_file(f"data.eval_files[{index}]", spec).name
                 for index, spec in enumerate(data.eval_files)]
        check_split_names(data.eval_files, names)
        train, vocabulary = read("data.train_file", data.train_file, None)
        evaluation = {}
        for index, (spec, name) in enumerate(zip(data.eval_files, names, strict=True)):
            field = f"data.eval_files[{index}]"
            evaluation[name] = read(field, spec, vocabulary)[0].check(f"{field} {spec}")
        if not evaluation:  # nanoGPT's split: the first share of the tokens trains, the rest is held out
            cut = int(train.token_count * (1 - options.validation_fraction))
            what = f"the held-out last {options.validation_fraction:.0%} of {data.train_file}"
            evaluation["validation"] = NextTokenRows(train.source, cut).check(what)
            train = NextTokenRows(train.source, 0, cut)
        train.check(f"data.train_file {data.train_file}")
        if options.sampling == "random_windows":
            slots = WindowSlots(train.source, train.first, train.stop)
            return CausalLMData(data.dataset, slots, evaluation, vocabulary, train, config.train.seed)
        return CausalLMData(data.dataset, train, evaluation, vocabulary, None, config.train.seed)

    def model_data(self, config: Any, options: Options, tokenizer_dir: Path) -> CausalLMData | None:
        """Generation reads no text: the vocabulary is the run's pinned characters or the checkpoint's tokenizer."""
        if options.tokenizer == "characters" and not options.characters:
            raise TpuplexError("the run's run.json holds no character vocabulary (task_options.characters, which "
                               "tpuplex train writes), and a trained run never rebuilds it from the text: restore "
                               "run.json from the run")
        vocabulary = (Characters(options.characters) if options.tokenizer == "characters"
                      else CheckpointTokenizer(tokenizer_dir))
        return CausalLMData(config.data.dataset, None, {}, vocabulary, seed=config.train.seed)

    def _prepare_conversations(self, config: Any, options: Options, tokenizer_dir: Path) -> CausalLMData:
        data, length = config.data, config.data.max_length
        fields = [f"data.eval_files[{index}]" for index in range(len(data.eval_files))]
        if options.prompt_template:
            names = [resolve_file(field, spec).name for field, spec in zip(fields, data.eval_files, strict=True)]

            def encode(field: str, spec: str) -> Encoded:
                records = chat.table_records(resolve_file(field, spec), options.prompt_template,
                                             options.answer_template, tokenizer_dir)
                return chat.encode(records, f"{spec} ({field})", tokenizer_dir, length)
        else:
            for field, spec in zip(fields, data.eval_files, strict=True):
                if not chat.is_chat(Path(spec).expanduser()):
                    raise TpuplexError(f"{field} = {spec!r} is not a .jsonl file of conversations, as "
                                       "data.train_file is: give held-out conversations in the same form")
            names = [Path(spec).stem for spec in data.eval_files]

            def encode(field: str, spec: str) -> Encoded:
                records = chat.jsonl_records(Path(spec).expanduser(), field)
                return chat.encode(records, f"{spec} ({field})", tokenizer_dir, length)
        check_split_names(data.eval_files, names)
        train = encode("data.train_file", data.train_file)
        evaluation = {name: encode(field, spec)
                      for field, spec, name in zip(fields, data.eval_files, names, strict=True)}
        if not evaluation:  # the last conversations are held out
            cut = len(train) - max(1, round(len(train) * options.validation_fraction))
            if cut < 1:
                raise TpuplexError(f"data.train_file {data.train_file} has {len(train)} conversation(s), too few to "
                                   f"hold out {options.validation_fraction:.0%}: give more, or data.eval_files")
            train, evaluation["validation"] = chat.rows(train, 0, cut), chat.rows(train, cut, len(train))
        return CausalLMData(data.dataset, train, evaluation, CheckpointTokenizer(tokenizer_dir), None,
                            config.train.seed, answer_width=chat.answer_width([train, *evaluation.values()]))

    def corpus_encoder(self, tokenizer_dir: Path) -> CorpusEncoder:
        return CorpusEncoder(str(tokenizer_dir))

    def prediction_inputs(self, config: Any, inputs: Any) -> Any:
        raise TpuplexError("a causal_lm run continues prompts: use Run.generate(prompts) (tpuplex generate)")

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

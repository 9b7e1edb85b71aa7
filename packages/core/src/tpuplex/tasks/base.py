"""What a task is: the kind of problem a run trains (sequence classification, masked-language modelling, ...).

A task is one folder (`tpuplex/tasks/<name>/`, or a module of your own named by import path) that owns everything
specific to its problem, in two halves:

- framework-free (this module's `Task`): which data it reads and how raw examples become static-shape host
  batches, its options (`[task]` fields), the head each model family gets under HF names, its metrics, its
  prediction files and what an HF export says about it;
- one small module per framework (`Task.backends["jax" | "tf" | "torch"]`), a subclass of that framework's
  `TaskModule` (`tpuplex_jax.tasks`, `.tf`, `.torch`: the same method names in each) with the head, what the
  model is called with, the loss of each unit the task weighs (an example, a token, a masked position) and
  serving.

The core's Trainer, batching, checkpoints and CLI, and the backends' devices, steps and optimizer, know no task:
a batch is a dict of arrays whose "weight" has the shape of the task's loss units, and every backend minimises
sum(weight * unit_loss) / max(sum(weight), 1) over the global batch.

The kinds of model a task trains are named in `Task.model_kinds` (`tpuplex.kinds`: a text encoder family, an
image family, your own model); the kind builds the network, the task adds its parts. A batch entry beyond the
model's inputs and targets (`protocol.head_inputs`) reaches the head as a keyword argument.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex.data.batching import Encoded
from tpuplex.errors import DataError, TpuplexError
from tpuplex.models import Architecture, Family
from tpuplex.protocol import TEXT_INPUTS, Batch


@dataclasses.dataclass(frozen=True)
class Head:
    """A task's head for one model family, described as data, and its forward pass on a text encoder (`forward`,
    written once over `tpuplex.models.ops.Ops`, as the encoder is: `tpuplex.models.encoder`).

    modules: canonical head module (`head.dense`) -> HF module name (`bert.pooler.dense`).
    shapes: canonical parameter name -> torch-layout shape, in the order the core initialises them.
    drawn: the canonical modules the core draws when the checkpoint lacks them (`tpuplex.kinds.text.initial_params`),
        in order, each "linear" (weight N(0, initializer_range), bias 0), "norm" (weight 1, bias 0) or "bias" (0).
    tied: canonical parameter -> the encoder parameter it is (the MLM decoder is the word embeddings).
    """

    modules: Mapping[str, str]
    shapes: Mapping[str, tuple[int, ...]]
    drawn: tuple[tuple[str, str], ...]
    tied: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def hf_name(self, canonical: str) -> str:
        module, leaf = canonical.rsplit(".", 1)
        return f"{self.modules[module]}.{leaf}"

    def without_dropout(self) -> Head:
        """The same head with every dropout rate 0 (heads without dropout return themselves)."""
        return self

    def forward(self, ops: Any, p: Mapping[str, Any], hidden: Any, **head_inputs: Any) -> Any:
        """The task's outputs (what its `unit_losses` take) of a text encoder's hidden states [B, L, H]: p holds the
        head's parameters and the encoder's under their canonical names (a tied decoder reads
        `embeddings.word.weight`); `head_inputs` are the batch's further entries (`tpuplex.protocol.head_inputs`).
        Dropout sites are negative (the encoder's are not)."""
        raise TpuplexError(f"{type(self).__name__} has no forward pass on a text encoder")


def matmul_weights(shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Weights of a head's Linear layers (its 2-D parameters): the multiply-adds it does per position."""
    return sum(int(np.prod(shape)) for shape in shapes.values() if len(shape) == 2)


class TaskData:
    """A task's data for one run, as the Trainer uses it: encoded splits, and the task's hooks on host batches.

    train: the training split (None in a model rebuilt to generate, `Task.model_data`); eval: evaluation split
    name -> split; test: a split to check but never train or evaluate on (None without one). `name` fills
    `{dataset}` in runtime.output_dir.
    per_token: whether `Backend.predict` returns one value per token ([B, L, ...]) rather than per row.
    """

    name: str
    train: Encoded | None
    eval: dict[str, Encoded]
    test: Encoded | None = None
    per_token: ClassVar[bool] = False

    def train_batch(self, batch: Batch, step: int) -> Batch:
        """The batch optimizer step `step` (1-based) trains on, from the Batcher's rows (input_ids,
        token_type_ids, attention_mask [B, L], labels and row weight [B]). Drawn randomness depends on
        (seed, step) only, so every backend and a resumed run see the same batch."""
        return batch

    def eval_batch(self, batch: Batch, index: np.ndarray) -> Batch:
        """An evaluation batch from the Batcher's rows; `index` [B] is each row's example (-1 for padding)."""
        return batch

    held_by: ClassVar[str] = ""
    """The config field that asks the devices to hold this data (`held`), where it is set ("task.images_on_device");
    empty: every batch carries its own data."""

    def held(self) -> dict[str, np.ndarray]:
        """Arrays the devices hold for the whole run, which every train step reads rows of (`Backend.hold`): an
        image run's training images with task.images_on_device. Empty: every batch carries its own data."""
        return {}

    def metrics(self, split: str, outputs: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> dict[str, float]:
        """The metrics of eval split `split` from every example's predict outputs [N, ...] and its evaluation
        batch's labels and weight (per row [N], or per token [N, max_length])."""
        raise NotImplementedError

    def pinned_options(self) -> dict[str, Any]:
        """Task options the data decided (the tag set), recorded in run.json: eval, predict and export of the run
        use them, whatever the files hold by then."""
        return {}

    def vocabulary_size(self) -> int | None:
        """The ids the run's tokenizer gives (a from-scratch model's `vocab_size` where its config.json leaves it
        out); None where the task has no tokenizer of its own."""
        return None

    def report(self) -> dict[str, Any]:
        """What results.json says about the data beyond its splits' sizes (e.g. words cut at max_length)."""
        return {}

    def splits(self) -> dict[str, Encoded]:
        """Every split to check (train, eval, test)."""
        return {**({"train": self.train} if self.train is not None else {}), **self.eval,
                **({"data.test_file": self.test} if self.test else {})}


def framework_modules(package: str) -> dict[str, str]:
    """`Task.backends` of the built-in task `package` (`tpuplex.tasks.<task>`), whose framework modules each
    backend package holds: `tpuplex_<backend>.tasks.<task>:Module`, a `TaskModule` subclass."""
    task = package.rsplit(".", 1)[-1]
    return {framework: f"tpuplex_{framework}.tasks.{task}:Module" for framework in ("jax", "tf", "torch")}


class Task:
    """A task's framework-free half; subclasses set the class attributes and implement `prepare` and `head`.

    name: the task's name in `[task] name`; Options: the dataclass of its other `[task]` fields; backends:
    framework -> import path of that framework's `TaskModule` ("package.module:Class"); auto_class:
    transformers' `AutoModelFor...`.
    """

    name: ClassVar[str]
    Options: ClassVar[type]
    backends: ClassVar[Mapping[str, str]]
    auto_class: ClassVar[str]
    model_kinds: ClassVar[tuple[str, ...]] = ("text",)
    """The kinds of model (`tpuplex.kinds`: "text", "image", "own") the task can train."""
    inputs: ClassVar[tuple[str, ...]] = TEXT_INPUTS
    """The batch entries the model takes (`tpuplex.protocol`)."""
    tokenized: ClassVar[bool] = True
    """Whether the task reads text through the checkpoint's tokenizer (False: images; a model of your own then
    needs no checkpoint)."""

    def check(self, config: Any, options: Any) -> None:
        """Cheap checks of the run's data settings (fields, files exist), before any backend starts."""

    def metric_names(self, config: Any, options: Any) -> Mapping[str, Sequence[str]] | None:
        """What each evaluation of a run of `config` will report, known from the config alone (no data is read: a
        file is at most looked up, or its first record peeked at): evaluation split name -> the metric names
        `TaskData.metrics` returns for it, the splits named as `prepare` names them. A name may be a pattern (`*/f1`,
        fnmatch's) where the data decides the rest (token classification's entity types). None: the task cannot say
        before its data is read (the default, a task of your own); `tpuplex tune` then finds a metric the task does
        not report at its first evaluation instead of before any trial."""
        return None

    def prepare_checkpoint(self, config: Any, options: Any, checkpoint_dir: Path | None) -> str | None:
        """What `tpuplex prepare CONFIG` adds to model.checkpoint before the data is read (span corruption: a
        tokenizer trained on the corpus, where the folder has none), said in a line; None: nothing (the default)."""
        return None

    def prepare(self, config: Any, options: Any, tokenizer_dir: Path | None) -> TaskData:
        """Read and encode the run's data (`config.data`), checking it first; `tokenizer_dir` is the model's
        checkpoint folder (a text task's tokenizer)."""
        raise NotImplementedError

    def model_data(self, config: Any, options: Any, tokenizer_dir: Path | None) -> TaskData | None:
        """The data a trained model is rebuilt from without reading any split (`train` None, no eval splits): what
        run.json pinned (`TaskData.pinned_options`) and the checkpoint folder hold. None: the task needs its data
        (the default)."""
        return None

    def example_batch(self, data: TaskData | None) -> dict[str, np.ndarray]:
        """Two rows of zeros shaped as the task's batches, to build a model's variables: token ids, types and mask
        int32 [2, 8], labels int32 [2]."""
        return {**{name: np.zeros((2, 8), np.int32) for name in TEXT_INPUTS}, "labels": np.zeros(2, np.int32)}

    def head(self, family: Family, arch: Architecture, hf_config: Mapping[str, Any], data: TaskData) -> Head:
        """The head `family` gets for `data` (its sizes may depend on the data: classes, tags)."""
        raise NotImplementedError

    def head_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float | None:
        """Forward FLOPs of the head on `batch` (`tpuplex.flops`; 0 where the kind's network ends in it), a
        function of the batch's shapes alone; None where they are not counted (a task of your own)."""
        return None

    def model_arguments(self, data: TaskData, head: Head, vocab_size: int) -> dict[str, Any]:
        """The keyword arguments a model of your own (`model.architecture`) is built with."""
        return {"vocab_size": vocab_size, "num_labels": head.num_labels}

    def hf_class(self, family: Family, model_type: str) -> str:
        """HF's class for this task and `model_type` (`BertForMaskedLM`): an HF export's "architectures"."""
        raise NotImplementedError

    def corpus_encoder(self, tokenizer_dir: Path) -> Any:
        """How `tpuplex prepare --task NAME` tokenizes a text corpus for this task
        (`tpuplex.data.corpus.DocumentEncoder`)."""
        raise TpuplexError(f"the {self.name} task trains on no text corpus: tpuplex prepare --task takes masked_lm "
                           "or causal_lm")

    def export_config(self, config: Any) -> dict[str, Any]:
        """Entries an exported HF config.json gets besides the family's own (labels, problem type)."""
        return {}

    def prediction_sources(self, config: Any, split: str) -> dict[str, Any]:
        """`tpuplex predict --split split`: what to predict, checked before any backend starts."""
        raise TpuplexError(f"the {self.name} task writes no predictions: use tpuplex eval for its metrics")

    def write_predictions(self, experiment: Any, state: Any, sources: dict[str, Any], out: Path,
                          write: bool) -> dict[str, Path]:
        """Predict `sources` with `state` and, when `write` (process 0), write one file per split into the folder
        `out`; returns split -> file."""
        raise TpuplexError(f"the {self.name} task writes no predictions")

    def prediction_inputs(self, config: Any, inputs: Sequence[Any]) -> Any:
        """`tpuplex.Run.predict(inputs)`: the inputs given in memory (texts, pairs of texts, words, files), checked
        and read as the task predicts them, before any backend starts."""
        raise TpuplexError(f"the {self.name} task predicts nothing from inputs: use Run.evaluate for its metrics")

    def predictions_of(self, experiment: Any, state: Any, inputs: Any) -> list[Any]:
        """The predictions of `inputs` (from `prediction_inputs`) with `state`, one per input, as the task's
        prediction files state them (a label, tags of words, a transcript)."""
        raise TpuplexError(f"the {self.name} task predicts nothing from inputs")

    def scored_predictions_of(self, experiment: Any, state: Any, inputs: Any) -> list[Any]:
        """`Run.predict(inputs, scores=True)`: each prediction as a record with the model's scores (a label with its
        probability and every class's, a transcript with its log-probability)."""
        raise TpuplexError(f"the {self.name} task gives no scores with its predictions: call Run.predict without "
                           "scores=True")


def check_inputs(inputs: Sequence[Any], kinds: type | tuple[type, ...], wanted: str) -> list[Any]:
    """`inputs` as a list, each of `kinds`; a DataError naming the first that is not, and what to give."""
    if isinstance(inputs, str | Path) or not isinstance(inputs, Sequence) or not inputs:
        raise DataError(f"inputs = {_shown(inputs)}: give a non-empty list of {wanted}")
    for index, item in enumerate(inputs):
        if not isinstance(item, kinds):
            raise DataError(f"inputs[{index}] = {_shown(item)}: give {wanted}")
    return list(inputs)


def probabilities(logits: np.ndarray) -> np.ndarray:
    """The softmax of `logits` over their last axis (the classes), in float64."""
    shifted = np.asarray(logits, np.float64) - np.max(logits, axis=-1, keepdims=True)
    exponent = np.exp(shifted)
    return exponent / exponent.sum(axis=-1, keepdims=True)


def scored_label(probability: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
    """A prediction with its scores from one row of class probabilities [C] (classes `names`): `label` (the most
    likely class), `score` (its probability) and `scores` (every class's, by name), as HF's classification
    pipelines give them with `top_k=None`."""
    best = int(np.argmax(probability))
    return {"label": names[best], "score": float(probability[best]),
            "scores": {name: float(value) for name, value in zip(names, probability, strict=True)}}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


TOKEN_METRICS = ("loss", "perplexity", "accuracy")
"""The names `token_metrics` returns."""


def evaluation_splits(config: Any, name: Callable[[str, str], str], held_out: str = "validation") -> tuple[str, ...]:
    """The evaluation splits of a task that names each `data.eval_files` entry after its file (`name(field, spec)`,
    as its `prepare` does) and, without any, holds `held_out` out of the training data (`Task.metric_names`)."""
    names = tuple(name(f"data.eval_files[{index}]", spec) for index, spec in enumerate(config.data.eval_files))
    return names or (held_out,)


def token_metrics(outputs: np.ndarray, weight: np.ndarray) -> dict[str, float]:
    """A language model's metrics from every position's predict outputs [N, P, 2] (cross-entropy, whether the
    most likely token is right; `tpuplex.tasks.<framework>.token_outputs`) and weight [N, P]: `loss` (mean
    cross-entropy per weighted token), `perplexity` (its exp) and `accuracy`."""
    total = max(float(weight.sum()), 1.0)
    loss = float((weight * outputs[..., 0]).sum() / total)
    accuracy = float((weight * outputs[..., 1]).sum() / total)
    return {"loss": loss, "perplexity": float(np.exp(loss)), "accuracy": accuracy}


def check_split_names(specs: Sequence[str], names: Sequence[str]) -> None:
    """One rule for every task: the split each `data.eval_files` entry gives (`names`, in order) is its own, as a
    split is named after its file, so two files of one name, or a file named like the training split, are refused,
    naming both."""
    given = {"train": "data.train_file"}
    for index, (spec, name) in enumerate(zip(specs, names, strict=True)):
        field = f"data.eval_files[{index}] = {spec!r}"
        if name in given:
            raise TpuplexError(f"{given[name]} and {field} would both be the split {name!r} (a split is named after "
                               "its file): rename one of the files")
        given[name] = field


def check_held_out(config: Any, fraction: float, task: str, held_out: str, example: float) -> None:
    """`task.validation_fraction` (`fraction`) in [0, 1), and some held-out data: `data.eval_files`, or that fraction
    of the training data. `held_out` names the data in the message ("text", "images"), `example` is a fraction."""
    if not 0 <= fraction < 1:
        raise TpuplexError(f"task.validation_fraction = {fraction} is not allowed: use a number in [0, 1), e.g. "
                           f"{example}")
    if not config.data.eval_files and fraction == 0:
        raise TpuplexError(f"the {task} task needs held-out {held_out}: set data.eval_files or "
                           f"task.validation_fraction (e.g. {example})")

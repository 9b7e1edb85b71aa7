"""Speech recognition with CTC (TensorFlowASR's CTC models, HF's `run_speech_recognition_ctc`): transcripts
spelled in characters, a Conformer (`model.checkpoint`: a folder whose config.json is a `conformer_ctc`) or your own
model (`model.architecture`).

    [task]
    name = "speech_recognition"
    sample_rate = 16000             # the features' rate (a recording at another is resampled to it)
    mel_bins = 80                   # log-mel features: 25 ms frames every 10 ms (frame_ms, hop_ms)
    normalize = "none"              # or "utterance": each mel bin to mean 0, variance 1 over the recording
    max_seconds = 30.0              # longer recordings are refused (every batch pads to its longest)
    validation_fraction = 0.1       # without data.eval_files: a seeded 10% of the utterances are held out
    time_masks = 2                  # SpecAugment in training: masks of up to time_mask_frames frames
    frequency_masks = 2             #   and of up to frequency_mask_bins mel bins, drawn from (seed, step)

    [data]
    train_file = "train.tsv"        # a manifest (.tsv/.csv/.jsonl/.parquet) of `path` (relative to it) and `text`
    eval_files = ["dev.tsv"]

Data: recordings are decoded (soundfile) and turned into log-mel features once, in the core
(`tpuplex.data.audio`), into prepared shards in `data.cache_dir`. The characters of the training transcripts are
the vocabulary (CTC's blank is id 0), recorded in run.json. Batches: features float32 [B, T, mel] and
attention_mask [B, T] (T a frame bucket fitted to the data, as text lengths are), labels int32 [B, U] (character
ids, 0 after the transcript; U the longest transcript of the run), weight [B]. The model returns (logits
[B, T', V], output_lengths [B]); the loss of an utterance is its CTC loss divided by its transcript's length (HF's
`ctc_loss_reduction = "mean"`), infinities zeroed. Evaluation decodes greedily (each frame's most likely symbol,
repeats merged, blanks dropped) and reports `wer` and `cer` (jiwer) and the `loss`, every utterance once.
`tpuplex predict RUN --split dev` writes `path<TAB>transcript`.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex.data import audio
from tpuplex.data.tables import DataFile, resolve_file
from tpuplex.errors import TpuplexError
from tpuplex.protocol import Batch
from tpuplex.tasks.base import Task, TaskData, check_held_out, check_inputs, check_split_names, framework_modules
from tpuplex.tasks.speech_recognition.data import SpeechSplit, Vocabulary, error_rates, spec_augment, split_of
from tpuplex.text_files import staged_text

TRAIN_STREAM = 1
"""SpecAugment draws from `default_rng([seed, TRAIN_STREAM, step])`."""


@dataclasses.dataclass(frozen=True)
class Options:
    sample_rate: int = 16000
    mel_bins: int = 80
    frame_ms: float = 25.0
    hop_ms: float = 10.0
    normalize: str = "none"
    max_seconds: float = 30.0
    audio_column: str = "path"
    text_column: str = "text"
    validation_fraction: float = 0.1
    time_masks: int = 2
    time_mask_frames: int = 20
    frequency_masks: int = 2
    frequency_mask_bins: int = 10
    characters: str = ""
    """The vocabulary; empty: the training transcripts' characters. A run records it."""

    @property
    def features(self) -> audio.LogMel:
        return audio.LogMel(self.sample_rate, self.mel_bins, self.frame_ms, self.hop_ms, self.normalize)


@dataclasses.dataclass(frozen=True)
class SpeechHead:
    """What the model's output layer and a model of your own are sized by: the vocabulary (blank included) and the
    mel bins of its input."""

    vocab_size: int
    mel_bins: int

    @property
    def num_labels(self) -> int:
        return self.vocab_size


@dataclasses.dataclass
class SpeechData(TaskData):
    name: str
    train: SpeechSplit
    eval: dict[str, SpeechSplit]
    vocabulary: Vocabulary
    options: Options
    seed: int
    per_token: ClassVar[bool] = True

    def train_batch(self, batch: Batch, step: int) -> Batch:
        options = self.options
        if not (options.time_masks or options.frequency_masks):
            return batch
        rng = np.random.default_rng([self.seed, TRAIN_STREAM, step])
        frames = batch["attention_mask"].sum(axis=1)
        return {**batch, "features": spec_augment(batch["features"], frames, rng, options.time_masks,
                                                  options.time_mask_frames, options.frequency_masks,
                                                  options.frequency_mask_bins)}

    def metrics(self, split: str, outputs: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> dict[str, float]:
        """outputs [N, T, 2]: each output frame's most likely symbol (-1 past the utterance's output frames) and
        the utterance's loss."""
        references = list(self.eval[split].texts)
        hypotheses = self.transcripts(outputs)
        return {**error_rates(references, hypotheses), "loss": float(np.mean(outputs[:, 0, 1]))}

    def transcripts(self, outputs: np.ndarray) -> list[str]:
        return [self.vocabulary.decode(row[:, 0].astype(np.int64)) for row in outputs]

    def pinned_options(self) -> dict[str, Any]:
        return {"characters": self.vocabulary.characters}

    def report(self) -> dict[str, Any]:
        return {"characters": self.vocabulary.characters, "mel_bins": self.options.mel_bins,
                "label_length": int(self.train.labels.shape[1]),
                "prepared": self.train.shards.location}


class SpeechRecognition(Task):
    name: ClassVar[str] = "speech_recognition"
    Options: ClassVar[type] = Options
    backends: ClassVar[Mapping[str, str]] = framework_modules(__name__)
    model_kinds: ClassVar[tuple[str, ...]] = ("speech", "own")
    auto_class: ClassVar[str] = ""
    inputs: ClassVar[tuple[str, ...]] = ("features", "attention_mask")
    tokenized: ClassVar[bool] = False

    def check(self, config: Any, options: Options) -> None:
        audio.require_soundfile()
        check_held_out(config, options.validation_fraction, self.name, "utterances", 0.1)
        if options.normalize not in audio.NORMALIZATIONS:
            raise TpuplexError(f"task.normalize = {options.normalize!r} is not a normalization: use \"none\" (the "
                               "log-mel as it is) or \"utterance\" (each mel bin to mean 0, variance 1 over the "
                               "recording)")
        for name in ("sample_rate", "mel_bins", "frame_ms", "hop_ms", "max_seconds"):
            if not getattr(options, name) > 0:
                raise TpuplexError(f"task.{name} = {getattr(options, name)!r} is not allowed: use a number greater "
                                   "than 0")
        for name in ("time_masks", "time_mask_frames", "frequency_masks", "frequency_mask_bins"):
            if getattr(options, name) < 0:
                raise TpuplexError(f"task.{name} = {getattr(options, name)!r} is not allowed: use 0 or more")
        if not config.data.train_file:
            raise TpuplexError("data.train_file is empty: name a manifest (.tsv/.csv/.jsonl) of audio paths and "
                               "transcripts")
        resolve_file("data.train_file", config.data.train_file)
        for index, spec in enumerate(config.data.eval_files):
            resolve_file(f"data.eval_files[{index}]", spec)

    def prepare(self, config: Any, options: Options, tokenizer_dir: Path | None) -> SpeechData:
        data, settings = config.data, options.features
        cache = Path(data.cache_dir).expanduser() / "audio"

        def manifest(field: str, spec: str) -> audio.Manifest:
            read = audio.read_manifest(resolve_file(field, spec), options.audio_column, options.text_column)
            empty = [row for row, text in zip(read.rows, read.texts, strict=True) if not text.strip()]
            if empty:
                raise TpuplexError(f"{empty[0]} of {field} has an empty transcript: give every recording its text")
            return read

        train_manifest = manifest("data.train_file", data.train_file)
        train_shards = audio.prepared(train_manifest, cache, settings, options.max_seconds)
        vocabulary = Vocabulary(options.characters or audio.characters(train_manifest.texts))
        held: dict[str, tuple[Any, np.ndarray, str]] = {}
        every = np.arange(len(train_shards), dtype=np.int64)
        if data.eval_files:
            names = [resolve_file(f"data.eval_files[{i}]", spec).name for i, spec in enumerate(data.eval_files)]
            check_split_names(data.eval_files, names)
            for index, (spec, name) in enumerate(zip(data.eval_files, names, strict=True)):
                field = f"data.eval_files[{index}]"
                shards = audio.prepared(manifest(field, spec), cache, settings, options.max_seconds)
                held[name] = (shards, np.arange(len(shards), dtype=np.int64), field)
            train_rows = every
        else:
            order = np.random.default_rng([config.train.seed, 0]).permutation(len(train_shards))
            cut = len(order) - max(1, round(len(order) * options.validation_fraction))
            if cut < 1:
                raise TpuplexError(f"data.train_file {data.train_file} has {len(order)} utterance(s), too few to "
                                   f"hold out {options.validation_fraction:.0%}: give more, or data.eval_files")
            train_rows, held["validation"] = np.sort(order[:cut]), (train_shards.reopened(), np.sort(order[cut:]),
                                                                    "data.train_file")
        lengths = [len(text) for text in train_manifest.texts]
        for shards, members, _ in held.values():
            lengths += [len(text) for text in audio.decode_strings(shards.read(members)["text"])]
        label_length = max(lengths)
        train = split_of(train_shards, train_rows, vocabulary, label_length, "data.train_file")
        evaluation = {name: split_of(shards, members, vocabulary, label_length, field)
                      for name, (shards, members, field) in held.items()}
        return SpeechData(data.dataset, train, evaluation, vocabulary, options, config.train.seed)

    def head(self, family: Any, arch: Any, hf_config: Mapping[str, Any], data: SpeechData) -> SpeechHead:
        return SpeechHead(vocab_size=data.vocabulary.size, mel_bins=data.options.mel_bins)

    def example_batch(self, data: SpeechData | None) -> dict[str, np.ndarray]:
        """Two utterances of 32 zero frames: features float32 [2, 32, mel], attention_mask [2, 32], labels [2, 4]."""
        mel = data.options.mel_bins if data is not None else Options.mel_bins
        return {"features": np.zeros((2, 32, mel), np.float32), "attention_mask": np.ones((2, 32), np.int32),
                "labels": np.ones((2, 4), np.int32)}

    def model_arguments(self, data: SpeechData, head: SpeechHead, vocab_size: int) -> dict[str, Any]:
        """A model of your own is built as `factory(vocab_size=..., mel_bins=...)` and called with (features
        [B, T, mel], attention_mask [B, T]); it returns (logits [B, T', vocab_size], output_lengths [B])."""
        return {"vocab_size": head.vocab_size, "mel_bins": head.mel_bins}

    def head_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        """0: the output layer is part of the kind's network."""
        return 0.0

    def hf_class(self, family: Any, model_type: str) -> str:
        raise TpuplexError("a speech model has no transformers class to export to: use tpuplex export --format "
                           "torch_export or saved_model")

    def prediction_sources(self, config: Any, split: str) -> dict[str, Any]:
        """`tpuplex predict --split`: an evaluation split of the run."""
        held_out = [resolve_file(f"data.eval_files[{i}]", spec).name for i, spec in enumerate(config.data.eval_files)]
        held_out = held_out or ["validation"]
        if split not in held_out:
            raise TpuplexError(f"--split {split!r} is not an evaluation split of the run: use one of "
                               f"{', '.join(held_out)}")
        return {split: None}

    def write_predictions(self, experiment: Any, state: Any, sources: dict[str, Any], out: Path,
                          write: bool) -> dict[str, Path]:
        """One TSV per split: each recording's path and its greedy transcript, in the manifest's order."""
        data, trainer, written = experiment.data, experiment.trainer, {}
        for name in sources:
            split = data.eval[name]
            outputs, _ = trainer.predict(state, trainer.batcher(split))
            if write:
                with staged_text(out / f"{name}.tsv") as staging:
                    staging.write("path\ttranscript\n")
                    for path, text in zip(split.paths, data.transcripts(outputs), strict=True):
                        staging.write(f"{path}\t{text}\n")
                written[name] = out / f"{name}.tsv"
        return written

    def prediction_inputs(self, config: Any, inputs: Sequence[Any]) -> list[Path]:
        """Recordings (paths of audio files), read and checked as the run's manifests are."""
        return [Path(path).expanduser() for path in check_inputs(inputs, str | Path, "recordings: audio file paths")]

    def predictions_of(self, experiment: Any, state: Any, inputs: list[Path]) -> list[str]:
        """Each recording's greedy transcript."""
        data, trainer = experiment.data, experiment.trainer
        listed = DataFile("Run.predict", "inputs", Path("inputs"), "", "inputs")
        manifest = audio.Manifest(listed, tuple(inputs), ("",) * len(inputs),
                                  tuple(f"inputs[{index}]" for index in range(len(inputs))))
        with tempfile.TemporaryDirectory() as folder:
            shards = audio.prepare(manifest, Path(folder) / "features", data.options.features, data.options.max_seconds)
            split = split_of(shards, np.arange(len(inputs), dtype=np.int64), data.vocabulary,
                             data.train.labels.shape[1], "Run.predict")
            outputs, _ = trainer.predict(state, trainer.batcher(split))
        return data.transcripts(outputs)


TASK = SpeechRecognition()

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
`tpuplex predict RUN --split dev` writes `path<TAB>transcript`; `--split my_wavs/` transcribes every recording under
a folder of your own (`my_wavs.tsv`), and `--data-dir DIR` (predict and eval) reads the run's evaluation manifests
from DIR by their names (`DIR/dev.tsv`), each recording checked as training checks it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex.data import audio
from tpuplex.data.tables import DataFile, resolve_file
from tpuplex.errors import DataError, TpuplexError, absence
from tpuplex.protocol import Batch
from tpuplex.tasks.base import Task, TaskData, check_held_out, check_inputs, check_split_names, framework_modules
from tpuplex.tasks.speech_recognition.data import (
    SpeechSplit,
    Vocabulary,
    check_alignable,
    error_rates,
    spec_augment,
    split_of,
)
from tpuplex.text_files import staged_text

TRAIN_STREAM = 1
"""SpecAugment draws from `default_rng([seed, TRAIN_STREAM, step])`."""
INPUTS = "Run.predict"
"""Where recordings given to `Run.predict` come from, in messages ("inputs[2] of Run.predict")."""


@dataclasses.dataclass(frozen=True)
class Options(audio.LogMel):
    """The `[task]` fields: the log-mel features' (`audio.LogMel`: sample_rate, mel_bins, frame_ms, hop_ms,
    normalize), then the data's, SpecAugment's and the vocabulary's."""

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
        """The feature settings alone (what the export's contract records)."""
        return audio.LogMel(**{field.name: getattr(self, field.name) for field in dataclasses.fields(audio.LogMel)})


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
        for field, spec in evaluation_manifests(config.data):
            resolve_file(field, spec)

    def metric_names(self, config: Any, options: Options) -> dict[str, tuple[str, ...]]:
        splits = [resolve_file(field, spec).name for field, spec in evaluation_manifests(config.data)]
        return dict.fromkeys(splits or ["validation"], ("wer", "cer", "loss"))

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
            manifests = evaluation_manifests(data)
            names = [resolve_file(field, spec).name for field, spec in manifests]
            check_split_names(data.eval_files, names)
            for (field, spec), name in zip(manifests, names, strict=True):
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
        for split in (train, *evaluation.values()):
            check_alignable(split)
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

    def prediction_sources(self, config: Any, split: str) -> dict[str, list[Path] | None]:
        """`tpuplex predict --split`: an evaluation split of the run (None: its utterances; with `--data-dir`, its
        manifest read from that folder), or an audio file or a folder of them (every .wav/.flac/.ogg under it),
        each recording read and checked as the run's manifests are."""
        path = Path(split).expanduser()
        both = TpuplexError(f"--data-dir is where a speech run's evaluation manifests are read, but --split {split} "
                            "names recordings already: drop --data-dir")
        try:
            held_out = [resolve_file(field, spec).name for field, spec in evaluation_manifests(config.data)]
        except DataError:
            if config.data.data_dir and path.exists():
                raise both from None
            raise
        held_out = held_out or ["validation"]
        if split in held_out:
            return {split: None}
        if not path.exists():
            raise TpuplexError(f"--split {split!r} is neither an evaluation split of the run ({', '.join(held_out)}) "
                               "nor an audio file or a folder of them")
        if config.data.data_dir:
            raise both
        return {path.stem or path.name: audio.audio_paths(path)}

    def write_predictions(self, experiment: Any, state: Any, sources: dict[str, list[Path] | None], out: Path,
                          write: bool) -> dict[str, Path]:
        """One TSV per split: each recording's path and its greedy transcript, in the manifest's order (a folder's
        recordings sorted by path)."""
        data, trainer, written = experiment.data, experiment.trainer, {}
        for name, files in sources.items():
            if files is None:
                split = data.eval[name]
                paths, transcripts = split.paths, data.transcripts(trainer.predict(state, trainer.batcher(split))[0])
            else:
                paths, transcripts = tuple(map(str, files)), _transcribed(experiment, state, files, f"--split {name}")
            if write:
                with staged_text(out / f"{name}.tsv") as staging:
                    staging.write("path\ttranscript\n")
                    for path, text in zip(paths, transcripts, strict=True):
                        staging.write(f"{path}\t{text}\n")
                written[name] = out / f"{name}.tsv"
        return written

    def prediction_inputs(self, config: Any, inputs: Sequence[Any]) -> list[Path]:
        """Recordings (paths of audio files), read and checked as the run's manifests are."""
        return [Path(path).expanduser() for path in check_inputs(inputs, str | Path, "recordings: audio file paths")]

    def predictions_of(self, experiment: Any, state: Any, inputs: list[Path]) -> list[str]:
        """Each recording's greedy transcript."""
        return _transcribed(experiment, state, inputs, INPUTS)

    def scored_predictions_of(self, experiment: Any, state: Any, inputs: list[Path]) -> list[dict[str, Any]]:
        """Each recording's greedy transcript and its `log_probability` under the model (CTC's: summed over every
        alignment of the transcript to the recording's frames; a second pass with the transcripts as labels)."""
        trainer = experiment.trainer
        transcripts = _transcribed(experiment, state, inputs, INPUTS)
        with _files_split(experiment, inputs, INPUTS, transcripts) as split:
            losses = trainer.predict(state, trainer.batcher(split))[0][:, 0, 1]  # CTC over the transcript's length
        return [{"transcript": text, "log_probability": -float(loss) * max(len(text), 1)}
                for text, loss in zip(transcripts, losses, strict=True)]


@contextlib.contextmanager
def _files_split(experiment: Any, files: Sequence[Path], field: str,
                 texts: Sequence[str] | None = None) -> Iterator[SpeechSplit]:
    """The recordings `files` as a SpeechSplit prepared in a temporary folder, each read and checked as the run's
    manifests are (messages name a file and where it was given: "inputs[2] of Run.predict", "recording 2 of
    --split my_wavs/"); `texts`: their transcripts (the labels), else none."""
    data, texts = experiment.data, tuple(texts) if texts is not None else ("",) * len(files)
    listed = DataFile(field, field, Path(field), "", field)
    rows = tuple(f"inputs[{index}]" if field == INPUTS else f"recording {index + 1}" for index in range(len(files)))
    manifest = audio.Manifest(listed, tuple(files), texts, rows)
    with tempfile.TemporaryDirectory() as folder:
        shards = audio.prepare(manifest, Path(folder) / "features", data.options.features, data.options.max_seconds)
        length = max([data.train.labels.shape[1], *map(len, texts)])
        yield split_of(shards, np.arange(len(files), dtype=np.int64), data.vocabulary, length, field)


def _transcribed(experiment: Any, state: Any, files: Sequence[Path], field: str) -> list[str]:
    """The greedy transcripts of the recordings `files` (`field` names them in messages)."""
    trainer = experiment.trainer
    with _files_split(experiment, files, field) as split:
        outputs, _ = trainer.predict(state, trainer.batcher(split))
    return experiment.data.transcripts(outputs)


def evaluation_manifests(data: Any) -> list[tuple[str, str]]:
    """(field, path) of each evaluation manifest of `data` (a DataConfig): data.eval_files, or, with data.data_dir
    (`tpuplex eval` / `tpuplex predict --data-dir`), the files of their names in that folder, the recordings they
    list relative to them and checked as training checks them."""
    fields = [(f"data.eval_files[{index}]", spec) for index, spec in enumerate(data.eval_files)]
    if not data.data_dir:
        return fields
    folder = Path(data.data_dir).expanduser()
    if not fields:
        raise DataError(f"data.data_dir = {data.data_dir!r} (--data-dir) is where a speech run reads its evaluation "
                        "manifests, by name, but this run holds its validation split out of data.train_file: remove "
                        "it (to transcribe recordings of your own: tpuplex predict RUN --split FOLDER)")
    if not folder.is_dir():
        raise DataError(f"data.data_dir {folder} {absence(folder)} (--data-dir): give the folder that holds the run's "
                        f"evaluation manifests ({', '.join(Path(spec).name for _, spec in fields)})")
    moved = []
    for field, spec in fields:
        path = folder / Path(spec).name
        if not path.exists() and not (":" in path.name and (folder / path.name.rpartition(":")[0]).is_dir()):
            raise DataError(f"data.data_dir {folder} (--data-dir) holds no {path.name}, the run's {field}: give the "
                            "folder that holds it (its audio paths relative to it), or transcribe a folder of "
                            "recordings with tpuplex predict RUN --split FOLDER")
        moved.append((f"{field} in data.data_dir", str(path)))
    return moved

TASK = SpeechRecognition()

"""Recordings as the speech task reads them: decoded once (`soundfile`), turned into log-mel features in numpy
(the same numbers for every backend), and written to prepared shards with their frame counts and transcripts.

Features (`LogMel`), TensorFlowASR's and `tf.signal`'s recipe, so a serving graph can compute them with TF's ops:

    frames     Hann-windowed (periodic) frames of `frame_ms`, every `hop_ms`, no padding at the ends
    power      |rfft(frame, n_fft)|^2, n_fft the power of 2 at or above the frame's samples
    mel        the power through `mel_bins` triangular filters on HTK's mel scale from 0 Hz to the Nyquist
               frequency (`tf.signal.linear_to_mel_weight_matrix`), then log(mel + 1e-6)
    normalised with `normalize = "utterance"`: each mel bin to mean 0 and variance 1 over the utterance's frames
               (TensorFlowASR's `normalize_feature`); "none" (the default) leaves the log-mel as it is

A prepared speech folder (`tpuplex.data.shards`) holds per utterance: `features` float32 [F, mel_bins] (F the
longest utterance's frames, zeros after its own), `frames` int32, `text` and `path` (UTF-8 bytes, zero-padded).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tpuplex.data import shards
from tpuplex.data.tables import DataFile, read_table
from tpuplex.errors import DataError, absence

EPSILON = 1e-6
FORMAT = "speech"
"""The `meta["task"]` of a prepared speech folder."""
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")
"""The recordings a folder given to `tpuplex predict --split` is searched for."""
NORMALIZATIONS = ("none", "utterance")
"""`LogMel.normalize`'s values (the speech task's `task.normalize`)."""


@dataclasses.dataclass(frozen=True)
class LogMel:
    """The feature settings (`task.*` of the speech task)."""

    sample_rate: int = 16000
    mel_bins: int = 80
    frame_ms: float = 25.0
    hop_ms: float = 10.0
    normalize: str = "none"

    @property
    def frame_length(self) -> int:
        return int(round(self.sample_rate * self.frame_ms / 1000))

    @property
    def hop_length(self) -> int:
        return int(round(self.sample_rate * self.hop_ms / 1000))

    @property
    def fft_length(self) -> int:
        return 1 << (self.frame_length - 1).bit_length()

    def frames(self, samples: int) -> int:
        """Feature frames of a recording of `samples` samples (0 when shorter than one frame)."""
        return 0 if samples < self.frame_length else 1 + (samples - self.frame_length) // self.hop_length

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """float32 [frames, mel_bins] of mono samples float32 [n] in [-1, 1] (n at least one frame)."""
        count = self.frames(len(audio))
        starts = np.arange(count)[:, None] * self.hop_length + np.arange(self.frame_length)[None, :]
        window = np.hanning(self.frame_length + 1)[:-1]  # periodic, as tf.signal.hann_window
        spectrum = np.fft.rfft(audio[starts].astype(np.float64) * window, n=self.fft_length)
        power = spectrum.real ** 2 + spectrum.imag ** 2
        mel = np.log(power @ mel_matrix(self.mel_bins, self.fft_length // 2 + 1, self.sample_rate) + EPSILON)
        if self.normalize == "utterance":
            mel = (mel - mel.mean(axis=0)) / np.sqrt(mel.var(axis=0) + EPSILON)
        return mel.astype(np.float32)


def mel_matrix(mel_bins: int, spectrum_bins: int, sample_rate: int) -> np.ndarray:
    """float64 [spectrum_bins, mel_bins]: `tf.signal.linear_to_mel_weight_matrix` from 0 Hz to the Nyquist
    frequency (HTK's mel scale, triangles that meet at their neighbours' centres, no weight on the DC bin)."""
    def mel(hertz: np.ndarray) -> np.ndarray:
        return 1127.0 * np.log1p(hertz / 700.0)

    linear = mel(np.linspace(0.0, sample_rate / 2, spectrum_bins)[1:])[:, None]
    edges = np.linspace(mel(np.float64(0.0)), mel(np.float64(sample_rate / 2)), mel_bins + 2)
    lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
    weights = np.maximum(0.0, np.minimum((linear - lower) / (centre - lower), (upper - linear) / (upper - centre)))
    return np.concatenate([np.zeros((1, mel_bins)), weights])


def require_soundfile() -> Any:
    try:
        import soundfile
    except ImportError:
        raise DataError("reading audio needs soundfile: pip install 'tpuplex-core[audio]' (or soundfile)") from None
    return soundfile


def read_recording(path: Path, settings: LogMel, max_seconds: float, where: str) -> np.ndarray:
    """Mono samples float32 [n] at `settings.sample_rate` of the audio file at `path` (WAV, FLAC, OGG: what
    libsndfile reads; resampled when recorded at another rate), checked: one DataError naming the file (and
    `where`, its manifest row) for a file that is missing or unreadable, cut short (a WAV whose header promises more
    samples than it holds: libsndfile reads what is there), not mono, holding NaN or infinite samples (a float
    file), shorter than one feature frame or longer than `max_seconds`."""
    soundfile = require_soundfile()
    if not path.is_file():
        raise DataError(f"{path} {absence(path)} ({where}): give audio paths relative to the manifest's folder")
    try:
        audio, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError, ValueError) as error:
        raise DataError(f"{path} cannot be read as audio ({where}: {error}): give a WAV, FLAC or OGG file, "
                        "whole") from None
    promised = wav_promised_frames(path)
    if promised is not None and promised > len(audio):
        raise DataError(f"{path} is cut short ({where}): its header promises {promised} samples "
                        f"({promised / rate:.2f} s), the file holds {len(audio)}: copy the recording again whole, or "
                        "remove it from the manifest")
    if audio.shape[1] != 1:
        raise DataError(f"{path} has {audio.shape[1]} channels ({where}): tpuplex reads mono recordings; mix it "
                        "down (e.g. sox in.wav -c 1 out.wav)")
    if not np.isfinite(audio).all():
        bad = int(np.size(audio) - np.isfinite(audio).sum())
        raise DataError(f"{path} holds {bad} NaN or infinite sample(s) ({where}), which would make the loss nan: "
                        "fix or re-export the recording (samples are numbers in [-1, 1]), or remove it from the "
                        "manifest")
    samples = audio[:, 0] if rate == settings.sample_rate else resampled(audio[:, 0], rate, settings.sample_rate)
    seconds = len(audio) / rate
    if settings.frames(len(samples)) == 0:
        raise DataError(f"{path} holds {len(audio)} samples, less than one {settings.frame_ms:g} ms frame "
                        f"({where}): remove the empty recording from the manifest")
    if seconds > max_seconds:
        raise DataError(f"{path} lasts {seconds:.1f} s, more than task.max_seconds = {max_seconds:g} ({where}): "
                        "cut it into utterances, or raise task.max_seconds (every batch is padded to the longest)")
    return samples


def wav_promised_frames(path: Path) -> int | None:
    """The sample frames a RIFF WAV file's header promises (its `data` chunk's size over the block size), or None
    for another format, a header that leaves the size open (0 or 0xFFFFFFFF, as streaming writers put) or one this
    cannot follow."""
    with path.open("rb") as handle:
        head = handle.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return None
        block = 0
        while True:
            chunk = handle.read(8)
            if len(chunk) < 8:
                return None
            name, size = chunk[:4], int.from_bytes(chunk[4:], "little")
            if name == b"data":
                return size // block if block and size not in (0, 0xFFFFFFFF) else None
            if name == b"fmt ":
                fmt = handle.read(size)
                block = int.from_bytes(fmt[12:14], "little") if len(fmt) >= 14 else 0
                handle.seek(size % 2, 1)
            else:
                handle.seek(size + size % 2, 1)


def resampled(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """float32 `samples` at `rate` Hz resampled to `target` Hz: scipy's polyphase filter (`resample_poly`, a
    Kaiser-windowed FIR low-pass at the lower rate's Nyquist frequency), as torchaudio's and librosa's "polyphase"
    modes do."""
    from scipy.signal import resample_poly

    common = math.gcd(rate, target)
    return resample_poly(samples, target // common, rate // common).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A manifest's utterances: audio paths (resolved against the manifest's folder) and transcripts, with where
    each row is ("<file> line 7")."""

    file: DataFile
    paths: tuple[Path, ...]
    texts: tuple[str, ...]
    rows: tuple[str, ...]

    def key(self, settings: LogMel, max_seconds: float) -> str:
        """What the prepared features depend on: the settings, and every row's path, size, time and text."""
        digest = hashlib.sha256(json.dumps([dataclasses.asdict(settings), max_seconds]).encode())
        for path, text in zip(self.paths, self.texts, strict=True):
            stat = path.stat() if path.is_file() else None
            digest.update(f"{path}\0{stat and stat.st_size}\0{stat and stat.st_mtime_ns}\0{text}\n".encode())
        return digest.hexdigest()[:16]


def read_manifest(file: DataFile, audio_column: str, text_column: str) -> Manifest:
    """The utterances of a .tsv/.csv/.jsonl/.parquet manifest (`tpuplex.data.tables`), paths relative to its
    folder."""
    table = read_table(file, (audio_column, text_column))
    paths = tuple((file.path.parent / str(value)).resolve() for value in table.columns[audio_column])
    texts = tuple(str(value) for value in table.columns[text_column])
    return Manifest(file, paths, texts, tuple(table.where(row) for row in range(len(table))))


def prepare(manifest: Manifest, folder: Path, settings: LogMel, max_seconds: float) -> shards.Shards:
    """Every utterance of `manifest` read, checked and turned into features, written to the prepared folder
    `folder` (whole or not at all: `tpuplex.data.shards.ShardWriter`)."""
    features = []
    for path, row in zip(manifest.paths, manifest.rows, strict=True):
        features.append(settings(read_recording(path, settings, max_seconds, f"{row} of {manifest.file.field}")))
    texts = [text.encode("utf-8") for text in manifest.texts]
    paths = [str(path).encode("utf-8") for path in manifest.paths]
    longest = max(len(f) for f in features)
    fields = {"features": shards.Field("float32", (longest, settings.mel_bins)), "frames": shards.Field("int32"),
              "text": shards.Field("uint8", (max(1, *map(len, texts)),)),
              "path": shards.Field("uint8", (max(map(len, paths)),))}
    meta = {"task": FORMAT, "settings": dataclasses.asdict(settings), "max_seconds": max_seconds,
            "source": str(manifest.file.path)}
    with shards.ShardWriter(folder, fields, columns=("frames",), meta=meta) as writer:
        for feature, text, path in zip(features, texts, paths, strict=True):
            padded = np.zeros((1, longest, settings.mel_bins), np.float32)
            padded[0, : len(feature)] = feature
            writer.add(features=padded, frames=np.array([len(feature)]), text=_padded(text, fields["text"]),
                       path=_padded(path, fields["path"]))
    return shards.open_shards(folder)


def _padded(value: bytes, field: shards.Field) -> np.ndarray:
    row = np.zeros((1, *field.shape), np.uint8)
    row[0, : len(value)] = np.frombuffer(value, np.uint8)
    return row


def decode_strings(rows: np.ndarray) -> list[str]:
    """uint8 [n, width] zero-padded UTF-8 -> n strings."""
    return [bytes(row).rstrip(b"\0").decode("utf-8") for row in rows]


def prepared(manifest: Manifest, cache: Path, settings: LogMel, max_seconds: float) -> shards.Shards:
    """The prepared features of `manifest` in `cache`, prepared on first use (and again when a file, a
    transcript or a setting changed)."""
    folder = cache / f"{manifest.file.path.stem}-{manifest.key(settings, max_seconds)}"
    if shards.is_prepared(folder):
        return shards.open_shards(folder)
    return prepare(manifest, folder, settings, max_seconds)


def audio_paths(path: Path) -> list[Path]:
    """The recordings to transcribe at `path`: the file itself, or every .wav/.flac/.ogg under the folder (any
    depth), sorted; a DataError when there is none."""
    found = [path] if path.is_file() else sorted(
        file for file in path.rglob("*") if file.is_file() and file.suffix.lower() in AUDIO_SUFFIXES)
    if not found:
        raise DataError(f"{path} holds no {'/'.join(AUDIO_SUFFIXES)} recording: give an audio file or a folder of "
                        "them")
    return found


def characters(texts: Sequence[str]) -> str:
    """The sorted characters of `texts`: a character vocabulary (CTC's blank is id 0, character i is id i + 1)."""
    return "".join(sorted(set("".join(texts))))

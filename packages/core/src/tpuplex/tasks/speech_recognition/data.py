"""Speech splits as the Batcher reads them, SpecAugment drawn by the core, greedy CTC decoding and error rates."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from tpuplex.data.audio import decode_strings
from tpuplex.data.shards import ReadStats, Shards
from tpuplex.errors import DataError

BLANK = 0
"""CTC's blank symbol; character i of the vocabulary is id i + 1, and 0 also pads a row's labels."""


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """The characters transcripts are spelled in (CTC's outputs: blank, then these)."""

    characters: str

    @property
    def size(self) -> int:
        """Outputs of the model: the blank and every character."""
        return len(self.characters) + 1

    def encode(self, text: str, where: str) -> np.ndarray:
        index = {character: position + 1 for position, character in enumerate(self.characters)}
        unknown = sorted(set(text) - set(index))
        if unknown:
            raise DataError(f"the transcript of {where} has {''.join(unknown)!r}, characters the training "
                            f"transcripts do not ({self.characters!r}): fix the transcript, or train on data "
                            "that has them")
        return np.array([index[character] for character in text], np.int32)

    def decode(self, ids: np.ndarray) -> str:
        """Greedy CTC: the most likely symbol of each frame, repeats merged, blanks dropped (ids < 0: no frame)."""
        ids = np.asarray(ids)
        ids = ids[ids >= 0]
        kept = ids[(ids != BLANK) & np.concatenate([[True], ids[1:] != ids[:-1]])]
        return "".join(self.characters[i - 1] for i in kept)


@dataclasses.dataclass(frozen=True)
class SpeechSplit:
    """Utterances `members` (int64 [N], rows of a prepared speech folder) with their transcripts as label ids.

    A Batcher batches it as rows of `lengths` = feature frames: `rows(indices, T)` gives features float32
    [b, T, mel], attention_mask int32 [b, T] (1 on the utterance's frames) and labels int32 [b, U] (character ids,
    0 after the transcript; U, the label length, is one for the whole run so a batch's shape is its frames').
    """

    shards: Shards
    members: np.ndarray
    labels: np.ndarray
    texts: tuple[str, ...]
    paths: tuple[str, ...]
    where: str = ""
    """Where the split came from (`data.eval_files[0]`), for messages."""

    def __len__(self) -> int:
        return len(self.members)

    @property
    def lengths(self) -> np.ndarray:
        return self.shards.column("frames")[self.members]

    @property
    def max_length(self) -> int:
        return int(self.shards.manifest["fields"]["features"]["shape"][0])

    @property
    def token_count(self) -> int:
        """Real frames in the split (padding efficiency counts frames)."""
        return int(self.lengths.sum())

    def rows(self, indices: np.ndarray, length: int) -> dict[str, np.ndarray]:
        read = self.shards.read(self.members[indices])
        frames = read["frames"]
        return {"features": np.ascontiguousarray(read["features"][:, :length]),
                "attention_mask": (np.arange(length)[None, :] < frames[:, None]).astype(np.int32),
                "labels": self.labels[indices]}

    @property
    def read_stats(self) -> ReadStats:
        return self.shards.stats

    def fingerprint(self) -> str:
        digest = hashlib.sha256(self.shards.fingerprint().encode())
        for array in (self.members, self.labels):
            digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()[:16]


def split_of(shards: Shards, members: np.ndarray, vocabulary: Vocabulary, label_length: int,
             where: str) -> SpeechSplit:
    """The utterances `members` of `shards`, their transcripts encoded by `vocabulary` into rows of
    `label_length` ids."""
    read = shards.read(members)
    texts, paths = decode_strings(read["text"]), decode_strings(read["path"])
    labels = np.zeros((len(members), label_length), np.int32)
    for row, (text, path) in enumerate(zip(texts, paths, strict=True)):
        ids = vocabulary.encode(text, f"{path} ({where})")
        labels[row, : len(ids)] = ids
    return SpeechSplit(shards, members, labels, tuple(texts), tuple(paths), where)


def ctc_symbols(labels: np.ndarray) -> np.ndarray:
    """int64 [N]: the fewest frames CTC aligns each row of `labels` [N, U] (0 after the transcript) to: one a
    character, and a blank between two equal ones (the backends' `feasible`)."""
    repeats = ((labels[:, 1:] == labels[:, :-1]) & (labels[:, 1:] != BLANK)).sum(axis=1)
    return (labels != BLANK).sum(axis=1).astype(np.int64) + repeats


def check_alignable(split: SpeechSplit) -> None:
    """A DataError naming the first utterance of `split` whose transcript needs more frames than its recording has
    feature frames, which no CTC model aligns (none makes more frames than it is given): a transcript of another
    recording, or of a longer one. (A transcript that fits the features but not the fewer frames a model makes of
    them, as the Conformer's subsampling does, is a fast speaker's: its loss is 0, as HF's `ctc_zero_infinity`.)"""
    needed = ctc_symbols(split.labels)
    short = np.flatnonzero(split.lengths < needed)
    if not short.size:
        return
    row = int(short[0])
    more = f"; {short.size - 1} more utterance(s) of the split alike" if short.size > 1 else ""
    raise DataError(f"{split.paths[row]} ({split.where}) has a transcript of {len(split.texts[row])} characters, more "
                    f"than CTC can fit in the {int(split.lengths[row])} feature frames of its audio: it needs "
                    f"{int(needed[row])} (one a character, a blank between repeated ones){more}: check that the "
                    "transcript is this recording's, or remove the row from the manifest")


def spec_augment(features: np.ndarray, frames: np.ndarray, rng: np.random.Generator, time_masks: int,
                 time_width: int, frequency_masks: int, frequency_width: int) -> np.ndarray:
    """SpecAugment's masks (Park et al., 2019) on features [b, T, mel]: per utterance, `time_masks` runs of up to
    `time_width` of its own frames and `frequency_masks` runs of up to `frequency_width` mel bins, set to 0 (as
    TensorFlowASR and the plain loops do: the mean of normalised features). Widths and starts are drawn from `rng`
    (the core's, from the seed and the step)."""
    features = features.copy()
    bins = features.shape[2]
    for row, count in enumerate(frames):
        for _ in range(time_masks):
            width = int(rng.integers(0, min(time_width, count) + 1))
            start = int(rng.integers(0, count - width + 1))
            features[row, start : start + width] = 0.0
        for _ in range(frequency_masks):
            width = int(rng.integers(0, min(frequency_width, bins) + 1))
            start = int(rng.integers(0, bins - width + 1))
            features[row, :, start : start + width] = 0.0
    return features


def error_rates(references: list[str], hypotheses: list[str]) -> dict[str, float]:
    """`wer` and `cer` (jiwer: word and character edit distances over the split's reference words/characters)."""
    try:
        import jiwer
    except ImportError:
        raise DataError("word error rates need jiwer: pip install 'tpuplex-core[audio]'") from None
    return {"wer": float(jiwer.wer(references, hypotheses)), "cer": float(jiwer.cer(references, hypotheses))}

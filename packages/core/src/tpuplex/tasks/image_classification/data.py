"""Image splits as the Batcher reads them, and the training augmentation the core draws for every step."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from tpuplex.data.images import PreparedImages
from tpuplex.data.shards import ReadStats


@dataclasses.dataclass(frozen=True)
class ImageSplit:
    """Rows `members` (int64 [N], indices into `prepared`) of a prepared image folder, as one split.

    A Batcher batches it like a tokenized split of length-1 rows: `rows` gives images uint8 [b, H, W, 3] and
    labels int32 [b], read from the shards' memory maps.
    """

    prepared: PreparedImages
    members: np.ndarray

    def __len__(self) -> int:
        return len(self.members)

    @property
    def labels(self) -> np.ndarray:
        return self.prepared.labels[self.members]

    @property
    def lengths(self) -> np.ndarray:
        return np.ones(len(self.members), np.int32)

    @property
    def max_length(self) -> int:
        return 1

    @property
    def token_count(self) -> int:
        """Every row is one "token": padding efficiency counts real rows."""
        return len(self.members)

    def rows(self, indices: np.ndarray, length: int) -> dict[str, np.ndarray]:
        chosen = self.members[indices]
        return {"images": self.prepared.images(chosen), "labels": self.prepared.labels[chosen]}

    @property
    def read_stats(self) -> ReadStats:
        """What this process has read of the split's prepared folder so far."""
        return self.prepared.shards.stats

    def fingerprint(self) -> str:
        digest = hashlib.sha256(self.prepared.fingerprint().encode())
        digest.update(np.ascontiguousarray(self.members, np.int64).tobytes())
        return digest.hexdigest()[:16]


def held_out(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) row indices: a seeded `fraction` of each class held out (at least one image per class),
    both sorted. Stratified, so a small validation split still has every class."""
    rng = np.random.default_rng([seed, 2])
    train, validation = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        count = max(1, int(round(len(members) * fraction)))
        validation.append(members[:count])
        train.append(members[count:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(validation))


def augment(images: np.ndarray, rng: np.random.Generator, crop_padding: int, flip: bool) -> np.ndarray:
    """images uint8 [B, H, W, C] -> uint8 [B, H, W, C]: each image zero-padded by `crop_padding` pixels on every
    side and cropped back at a random offset (torchvision's RandomCrop(padding=p)), then mirrored left-right with
    probability 1/2 when `flip`. Draws B offset pairs, then B flips, from `rng`, whatever is switched on, so the
    pixels depend on (rng, batch) alone."""
    batch, height, width, _ = images.shape
    offsets = rng.integers(0, 2 * crop_padding + 1, size=(batch, 2))
    flips = rng.random(batch) < 0.5
    out = images
    if crop_padding:
        padded = np.pad(images, [(0, 0), (crop_padding, crop_padding), (crop_padding, crop_padding), (0, 0)])
        out = np.stack([padded[row, top : top + height, left : left + width]
                        for row, (top, left) in enumerate(offsets)])
    if flip:
        out = np.where(flips[:, None, None, None], out[:, :, ::-1], out)
    return np.ascontiguousarray(out)

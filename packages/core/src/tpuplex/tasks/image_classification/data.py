"""Image splits as the Batcher reads them, and the training augmentation the core draws for every step: applied on
the host (`augment`), or, with the training images held on the device, in the compiled step (`crop_and_flip`)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np

from tpuplex.data.images import PreparedImages
from tpuplex.data.shards import ReadStats


@dataclasses.dataclass(frozen=True)
class ImageSplit:
    """Rows `members` (int64 [N], indices into `prepared`) of a prepared image folder, as one split.

    A Batcher batches it like a tokenized split of length-1 rows: `rows` gives images uint8 [b, H, W, 3] and
    labels int32 [b], read from the shards' memory maps; with `by_index` (the images held on the device) it gives
    `image_index` int32 [b] instead of the pixels: the rows of `images_held()`.
    """

    prepared: PreparedImages
    members: np.ndarray
    by_index: bool = False

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
        if self.by_index:
            return {"image_index": np.asarray(indices, np.int32), "labels": self.prepared.labels[chosen]}
        return {"images": self.prepared.images(chosen), "labels": self.prepared.labels[chosen]}

    def images_held(self) -> np.ndarray:
        """uint8 [N, H, W, 3]: every image of the split, in row order, for the device to hold."""
        return self.prepared.images(self.members)

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


def draw_augmentation(rng: np.random.Generator, batch: int, crop_padding: int) -> tuple[np.ndarray, np.ndarray]:
    """B crop offsets int64 [B, 2] in [0, 2 * crop_padding] (top, left of the padded image), then B flips bool [B]
    from `rng`, whatever is switched on, so the pixels depend on (rng, batch) alone."""
    return rng.integers(0, 2 * crop_padding + 1, size=(batch, 2)), rng.random(batch) < 0.5


def augment(images: np.ndarray, rng: np.random.Generator, crop_padding: int, flip: bool) -> np.ndarray:
    """images uint8 [B, H, W, C] -> uint8 [B, H, W, C]: each image zero-padded by `crop_padding` pixels on every
    side and cropped back at a random offset (torchvision's RandomCrop(padding=p)), then mirrored left-right with
    probability 1/2 when `flip` (`draw_augmentation`'s draws)."""
    batch, height, width, _ = images.shape
    offsets, flips = draw_augmentation(rng, batch, crop_padding)
    out = images
    if crop_padding:
        padded = np.pad(images, [(0, 0), (crop_padding, crop_padding), (crop_padding, crop_padding), (0, 0)])
        out = np.stack([padded[row, top : top + height, left : left + width]
                        for row, (top, left) in enumerate(offsets)])
    if flip:
        out = np.where(flips[:, None, None, None], out[:, :, ::-1], out)
    return np.ascontiguousarray(out)


def augmentation_rows(rng: np.random.Generator, batch: int, crop_padding: int, flip: bool) -> dict[str, np.ndarray]:
    """`augment`'s draws as a batch's entries for `crop_and_flip`: `shift` int32 [B, 2], each image's move (row,
    column) in [-crop_padding, crop_padding], and `flip` int32 [B] (1: mirrored)."""
    offsets, flips = draw_augmentation(rng, batch, crop_padding)
    return {"shift": (offsets - crop_padding).astype(np.int32), "flip": (flips & flip).astype(np.int32)}


def crop_and_flip(ops: Any, held: Any, index: Any, shift: Any, flip: Any) -> Any:
    """`augment` on the device, written once over `tpuplex.models.ops.Ops` (and the arrays' own indexing, which
    torch and jax share): held uint8 [N, H, W, C], the training images the device holds; index int32 [B], the rows
    chosen; shift int32 [B, 2] and flip int32 [B] (`augmentation_rows`) -> uint8 [B, H, W, C], each image moved by
    its shift (zeros where it leaves the frame, as a crop of the zero-padded image) and mirrored where flip is 1.
    The same pixels as `augment` with the same draws."""
    _, height, width, _ = ops.shape(held)
    columns = ops.arange(width)[None]
    rows = shift[:, :1] + ops.arange(height)[None]  # [B, H]
    columns = shift[:, 1:] + ops.where(flip[:, None] > 0, width - 1 - columns, columns)  # [B, W]
    inside = (((rows >= 0) & (rows < height))[:, :, None] & ((columns >= 0) & (columns < width))[:, None, :])
    pixels = held[index[:, None, None], rows.clip(0, height - 1)[:, :, None], columns.clip(0, width - 1)[:, None, :]]
    return ops.where(inside[..., None], pixels, ops.constant(np.zeros((), np.uint8)))

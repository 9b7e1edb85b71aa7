"""Images prepared once into memory-mapped shards: the TPU lesson's "JPEGs to TFRecords" step, without TensorFlow.

    tpuplex prepare ../shared/images/flowers --out data/flowers-160 --image-size 160 160

Sources are a class-per-folder tree (`<root>/<class>/*.jpg|jpeg|png`; other files are ignored, as torchvision's
ImageFolder and Keras' `image_dataset_from_directory` ignore them) or a CSV/JSONL listing of (path, label) pairs.
Classes are sorted by name; a class's index is its position.

Every image is decoded once, converted to RGB and resized (`decode`), then written as prepared shards
(`tpuplex.data.shards`, the format every task reads): one record per image, its pixels (uint8 [H, W, 3]) and its
label (int32), with the labels also as a column (a stratified hold-out needs them all). The manifest's `meta`
records the classes, the image shape, the class counts, the sources' content hash and the resize rule.

Why raw pixels rather than JPEG bytes: a training step then reads its rows with no decode at all, so input never
competes with the step for the CPU. The price is disk: H * W * 3 bytes per image (76,800 at 160 x 160, about the
JPEG's own size for the flower photos; 3,072 for CIFAR-10).

The folder is written under a temporary name and renamed into place when complete, so an interrupted `prepare`
never leaves a shard that a run would read; the next `prepare` of that folder starts afresh and deletes what a
killed one left.
"""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import hashlib
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tpuplex.data.progress import Progress
from tpuplex.data.shards import MANIFEST, Field, Shards, ShardWriter, is_prepared, open_shards
from tpuplex.errors import DataError, absence

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
PREPARED_FORMAT = 3
"""Bumped whenever what is written for the same sources changes (2: TensorFlow's resize instead of Pillow's;
3: prepared shards with per-record checksums)."""
KIND = "images"
DECODE_CHUNK = 256
"""Images decoded (in parallel) and written at a time."""
RESIZE_RULE = ("center crop to the target aspect ratio (rounded down, at least 1 pixel, offsets "
               "floor((size - crop) / 2)), then "
               "tf.image.resize(method='bilinear', antialias=True) computed in numpy (`resize`), rounded half to "
               "even and clipped to uint8; RGB via Pillow's Image.convert('RGB'): grayscale repeated, alpha dropped, "
               "CMYK by Pillow's conversion; EXIF orientation not applied")


@dataclasses.dataclass(frozen=True)
class ImageList:
    """Images to prepare: `paths` [N] with class indices `labels` int32 [N] into `classes` (sorted)."""

    paths: tuple[Path, ...]
    labels: np.ndarray
    classes: tuple[str, ...]
    origin: str

    def __len__(self) -> int:
        return len(self.paths)

    def key(self) -> str:
        """A cheap hash of the listing (paths, sizes, modification times, labels) and of how it is prepared: a
        prepared cache is reused while both are unchanged. The manifest also records a hash of the files' bytes."""
        digest = hashlib.sha256(json.dumps([PREPARED_FORMAT, RESIZE_RULE, self.classes]).encode())
        for path, label in zip(self.paths, self.labels.tolist(), strict=True):
            stat = path.stat()
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{label}\n".encode())
        return digest.hexdigest()[:16]


def scan_folder(root: str | Path) -> ImageList:
    """The images of a class-per-folder tree: every `<root>/<class>/*.{jpg,jpeg,png}` (any case), classes sorted."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"image folder {root} does not exist or is not a folder: give a folder with one "
                        "sub-folder of images per class")
    classes = tuple(sorted(entry.name for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith(".")))
    if len(classes) < 2:
        raise DataError(f"image folder {root} has {len(classes)} class folder(s) ({', '.join(classes) or 'none'}): "
                        "a classifier needs at least two, one sub-folder of images per class")
    paths, labels = [], []
    for index, name in enumerate(classes):
        found = sorted(p for p in (root / name).iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not found:
            raise DataError(f"class folder {root / name} holds no {'/'.join(IMAGE_SUFFIXES)} file: add its "
                            "images or remove the folder")
        paths += found
        labels += [index] * len(found)
    return ImageList(tuple(paths), np.asarray(labels, np.int32), classes, str(root))


def image_paths(path: str | Path) -> list[Path]:
    """The images to predict at `path`: the file itself, or every .jpg/.jpeg/.png under the folder (any depth),
    sorted."""
    path = Path(path).expanduser()
    found = ([path] if path.is_file() else
             sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES))
    if not found or any(p.suffix.lower() not in IMAGE_SUFFIXES for p in found):
        raise DataError(f"{path} holds no {'/'.join(IMAGE_SUFFIXES)} image: give an image file or a folder of "
                        "them")
    return found


def read_listing(file: str | Path, classes: Sequence[str] = ()) -> ImageList:
    """The images a CSV (header `path,label`) or JSONL (`{"path": ..., "label": ...}`) file lists; relative paths
    are relative to the file. Classes are `classes` when given, else the sorted distinct labels."""
    file = Path(file).expanduser()
    if not file.is_file():
        raise DataError(f"{file} {absence(file)}: give a folder with one sub-folder of images per class, or a "
                        ".csv (path,label) or .jsonl listing of the images")
    if file.suffix.lower() == ".csv":
        with file.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    elif file.suffix.lower() == ".jsonl":
        rows = [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        raise DataError(f"image listing {file} is neither .csv nor .jsonl: write (path, label) rows in one of them")
    if not rows or any("path" not in row or "label" not in row for row in rows):
        raise DataError(f"image listing {file} needs a 'path' and a 'label' in every row (a CSV header "
                        "path,label)")
    names = [str(row["label"]) for row in rows]
    classes = tuple(classes) or tuple(sorted(set(names)))
    unknown = sorted(set(names) - set(classes))
    if unknown:
        raise DataError(f"image listing {file} has labels {unknown[:5]} outside the classes {list(classes)}")
    if len(classes) < 2:
        raise DataError(f"image listing {file} has {len(classes)} class: a classifier needs at least two")
    paths = tuple((file.parent / row["path"]).resolve() for row in rows)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DataError(f"image listing {file} names {len(missing)} missing file(s), first {missing[0]}")
    index = {name: i for i, name in enumerate(classes)}
    return ImageList(paths, np.asarray([index[n] for n in names], np.int32), classes, str(file))


def decode(data: bytes, size: tuple[int, int] | None, name: str = "image") -> np.ndarray:
    """Encoded image bytes -> uint8 [H, W, 3] RGB, resized to `size` = (H, W) by RESIZE_RULE (as is when None).

    Pillow decodes (its JPEG decoder is libjpeg's accurate integer IDCT, the pixels TensorFlow's
    `decode_jpeg(dct_method="INTEGER_ACCURATE")` gives); the resize is TensorFlow's, so an exported SavedModel
    can apply the same decode and resize to the bytes it serves. Raises one TpuplexError naming `name` when the
    bytes are not a complete image Pillow can read."""
    require_pillow()
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            rgb = np.asarray(image.convert("RGB"), np.uint8)
    except UnidentifiedImageError:
        raise DataError(f"{name} is not an image Pillow can read: remove it or convert it to JPEG/PNG") from None
    except (OSError, SyntaxError, ValueError) as error:
        raise DataError(f"{name} cannot be decoded ({error}): the file is damaged or truncated; remove or "
                        "replace it") from None
    return rgb if size is None else resize(center_crop(rgb, size), size)


def require_pillow() -> None:
    """One clear error when Pillow, which decodes the images, is not installed."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise DataError("image tasks decode images with Pillow, which is not installed: pip install "
                        "'tpuplex-core[images]' (or pip install pillow)") from None


def center_crop(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The largest centred crop of `image` [h, w, C] with the aspect ratio of `size` (H, W), sizes rounded down
    (to no less than one pixel)."""
    height, width = image.shape[:2]
    crop_w = max(1, min(width, height * size[1] // size[0]))  # at least one pixel: a 1x1 image stays its colour
    crop_h = max(1, min(height, width * size[0] // size[1]))
    top, left = (height - crop_h) // 2, (width - crop_w) // 2
    return image[top : top + crop_h, left : left + crop_w]


def resize(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 [h, w, C] -> uint8 [H, W, C]: `tf.image.resize(image, size, "bilinear", antialias=True)` (TensorFlow's
    ScaleAndTranslate with a triangle kernel widened by the downscale factor), rows then columns, each output a
    float32 sum over its span in order, then rounded half to even and clipped, as `tf.round` and a saturating cast do.
    (Taps past the image's edge have weight 0: adding 0 * x leaves each float32 sum as TensorFlow's, which skips
    them.)"""
    rows_start, rows_weight = _spans(size[0], image.shape[0])
    cols_start, cols_weight = _spans(size[1], image.shape[1])
    pixels = image.astype(np.float32)
    rows = _weighted_taps(pixels, rows_start, rows_weight, axis=0)
    out = _weighted_taps(rows, cols_start, cols_weight, axis=1)
    return np.clip(np.round(out, out=out), 0, 255, out=out).astype(np.uint8)


def _weighted_taps(values: np.ndarray, starts: np.ndarray, weights: np.ndarray, axis: int) -> np.ndarray:
    """Along `axis`: output i = sum over taps t, in order, of weights[i, t] * values[starts[i] + t] (float32)."""
    shape = [1, 1, 1]
    shape[axis] = len(starts)
    out = np.zeros(values.shape[:axis] + (len(starts),) + values.shape[axis + 1 :], np.float32)
    product = np.empty_like(out)
    last = values.shape[axis] - 1
    for tap in range(weights.shape[1]):
        gathered = np.take(values, np.minimum(starts + tap, last), axis=axis)
        np.multiply(weights[:, tap].reshape(shape), gathered, out=product)
        out += product
    return out


def _spans(output_size: int, input_size: int) -> tuple[np.ndarray, np.ndarray]:
    """ScaleAndTranslate's spans for a triangle kernel with antialiasing (its `ComputeSpansCore`, the same float32
    operations, vectorised over the outputs): each output's first input index int64 [output_size] and normalised
    weights float32 [output_size, span], 0 past its own span."""
    f32 = np.float32
    inv_scale = f32(1.0 / float(f32(output_size) / f32(input_size)))
    kernel_scale = max(inv_scale, f32(1.0))
    span = min(2 * int(np.ceil(kernel_scale)) + 1, input_size)
    sample = (np.arange(output_size, dtype=np.float32) + f32(0.5)) * inv_scale + f32(-0.0)
    starts = np.clip(np.ceil(sample - kernel_scale - f32(0.5)), 0, input_size - 1).astype(np.int64)
    ends = np.clip(np.floor(sample + kernel_scale - f32(0.5)), 0, input_size - 1).astype(np.int64) + 1
    taps = np.zeros((output_size, span), np.float32)
    total = np.zeros(output_size, np.float32)
    for tap in range(span):
        source = starts + tap
        distance = np.abs((source.astype(np.float32) + f32(0.5) - sample) * (f32(1.0) / kernel_scale))
        taps[:, tap] = np.where((source < ends) & (distance < 1), f32(1.0) - distance, f32(0.0))
        total += taps[:, tap]  # in tap order, as TensorFlow sums them
    usable = (np.abs(total) >= 1000 * np.finfo(np.float32).tiny) & (sample >= 0) & (sample <= input_size)
    weights = np.where(usable[:, None], taps * (f32(1.0) / np.where(usable, total, f32(1.0)))[:, None], f32(0.0))
    return np.where(usable, starts, 0), weights.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class PreparedImages:
    """A prepared image folder, read lazily: the images of the rows a batch needs, from their records."""

    shards: Shards

    @property
    def manifest(self) -> dict:
        return self.shards.manifest

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self.shards.meta["classes"])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.shards.meta["image_shape"])

    def __len__(self) -> int:
        return len(self.shards)

    @property
    def labels(self) -> np.ndarray:
        """int32 [N], every image's label in order (read once, from the shards' label columns)."""
        return self.shards.column("labels")

    def images(self, rows: np.ndarray) -> np.ndarray:
        """uint8 [len(rows), H, W, 3]: the images at global indices `rows`, read from their records."""
        return self.shards.read(rows)["images"]

    def fingerprint(self) -> str:
        """The hash of the shards' content, as the manifest records it."""
        return self.shards.fingerprint()


def open_prepared(location: str | Path) -> PreparedImages:
    """The prepared image folder at `location` (a path or an fsspec URL), its manifest checked."""
    if not is_prepared(location):
        raise DataError(f"{location} is not a prepared image folder (no {MANIFEST}): run tpuplex prepare on the "
                        "images first, or point data.train_file at the image folder itself")
    shards = open_shards(location)
    meta = shards.meta
    if meta.get("kind") != KIND or meta.get("format") != PREPARED_FORMAT:
        raise DataError(f"{location} holds {meta.get('kind')} prepared in format {meta.get('format')}, this "
                        f"tpuplex reads images in format {PREPARED_FORMAT}: run tpuplex prepare again")
    classes, counted = list(meta.get("classes", ())), list(meta.get("class_counts", {}))
    if not classes or classes != counted:
        raise DataError(f"{location}/{MANIFEST} names the classes {classes} but counts images of {counted}: run "
                        "tpuplex prepare again (the classes are the image folders' or the listing's labels)")
    return PreparedImages(shards)


def prepare(images: ImageList, folder: str | Path, size: tuple[int, int] | None, shard_size: int = 4096,
            workers: int = 0) -> PreparedImages:
    """Decode, convert and resize every image of `images` once and write the prepared `folder` (see the module).

    size: (H, W), or None to keep the images' own size (then all must have the same). workers: decoding threads
    (Pillow releases the GIL while it decodes and resizes), 0 for one per CPU core.
    """
    if shard_size < 1:
        raise DataError(f"shard_size = {shard_size}: use 1 or more images per shard")
    sources = hashlib.sha256()
    writer, shape, first = None, None, None

    def load(path: Path) -> tuple[bytes, np.ndarray]:
        data = path.read_bytes()
        return data, decode(data, size, str(path))

    progress = Progress(f"decoding the images of {images.origin}", "images", total=len(images))
    try:
        with concurrent.futures.ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
            for begin in range(0, len(images), DECODE_CHUNK):
                paths = images.paths[begin : begin + DECODE_CHUNK]
                decoded = []
                for path, (data, image) in zip(paths, pool.map(load, paths), strict=True):
                    sources.update(hashlib.sha256(data).digest())
                    if shape is None:
                        shape, first = image.shape, path
                        writer = ShardWriter(folder, {"images": Field("uint8", shape), "labels": Field("int32")},
                                             columns=("labels",), shard_rows=shard_size)
                    elif image.shape != shape:
                        raise DataError(f"{path} is {image.shape[1]}x{image.shape[0]} but {first} is "
                                        f"{shape[1]}x{shape[0]}: set an image size (--image-size H W, or "
                                        "task.image_size) so every image is resized to it")
                    decoded.append(image)
                writer.add(images=np.stack(decoded), labels=images.labels[begin : begin + DECODE_CHUNK])
                progress.advance(len(decoded))
        progress.close()
        counts = np.bincount(images.labels, minlength=len(images.classes))
        writer.meta.update(kind=KIND, format=PREPARED_FORMAT, classes=list(images.classes), image_shape=list(shape),
                           class_counts=dict(zip(images.classes, counts.tolist(), strict=True)),
                           sources=images.origin, sources_sha256=sources.hexdigest(),
                           resize=RESIZE_RULE if size else "none (the images' own size)")
    except BaseException:
        if writer is not None:
            writer.abandon()
        raise
    writer.close()
    return open_prepared(folder)

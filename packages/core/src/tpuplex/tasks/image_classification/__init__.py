"""Image classification (keras-hub's `ImageClassifier`): one class per image, with a ResNet or ViT described by
an HF config.json (`model.checkpoint`: a folder with config.json, and model.safetensors to start from trained
weights) or your own model (`model.architecture`).

    [task]
    name = "image_classification"
    image_size = [160, 160]         # (H, W) every image is resized to when prepared; [] keeps the images' own size
    validation_fraction = 0.1       # without data.eval_files: a seeded 10% of each class is held out
    crop_padding = 0                # training crops: pad by this many pixels, crop back at a random offset
    flip = true                     # training flips: mirror left-right with probability 1/2
    images_on_device = false        # hold the training images on the device, cropped and flipped in the step

    [data]
    dataset = "flowers"
    train_file = "../shared/images/flowers"   # a class-per-folder tree, a .csv/.jsonl of (path, label), or a
                                              # folder `tpuplex prepare` wrote
    eval_files = []                           # the same kinds, for held-out splits

Data: images are decoded and resized once into memory-mapped shards (`tpuplex.data.images`); a run pointed at raw
images prepares them into `data.cache_dir` itself. Batches: images uint8 [B, H, W, 3] (each backend's task module
scales them to [0, 1] on the device), labels int32 [B], weight [B]; the training crops and flips are drawn by the
core from (seed, step), so every backend and replica count sees the same pixels. With `images_on_device` (torch and
jax) the devices hold the training set (uint8, `TaskData.held`) and a training batch carries only each row's index,
shift and flip (`image_index`, `shift` [B, 2], `flip`), which the compiled step turns into the same pixels
(`data.crop_and_flip`): the host chooses, the device reads. Loss: cross-entropy. Metrics:
`accuracy` and `loss`. Predictions: a TSV per eval split or image folder (`tpuplex predict --split`). Export: a
SavedModel served from encoded bytes (`tpuplex_tf.tasks.image_classification`), or a `torch.export` program
(`tpuplex_torch.tasks.image_classification`); see docs/images.md.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tpuplex.data import images as image_files
from tpuplex.errors import DataError, TpuplexError, absence
from tpuplex.metrics import cross_entropy
from tpuplex.models import ImageFamily
from tpuplex.protocol import Batch
from tpuplex.tasks.base import (
    Task,
    TaskData,
    check_held_out,
    check_inputs,
    check_split_names,
    evaluation_splits,
    framework_modules,
    scored_label,
)
from tpuplex.tasks.image_classification.data import ImageSplit, augment, augmentation_rows, held_out
from tpuplex.tasks.sequence_classification.heads import ClassifierHead
from tpuplex.text_files import staged_text

TRAIN_STREAM = 0
"""Training augmentation draws from `default_rng([seed, TRAIN_STREAM, step])`."""


@dataclasses.dataclass(frozen=True)
class Options:
    image_size: tuple[int, ...] = ()
    validation_fraction: float = 0.1
    crop_padding: int = 0
    flip: bool = True
    images_on_device: bool = False
    """Hold the training images on the devices (uint8; CIFAR-10's 50,000 are 150 MB) and crop and flip them in the
    compiled step, so the host only chooses rows: for a fast accelerator the host cannot feed (torch and jax)."""
    classes: tuple[str, ...] = ()
    """The class names in index order; empty: the training images' (sorted folder names or labels). A run records
    them, so its eval, predict and export use the classes it trained on."""


@dataclasses.dataclass
class ImageData(TaskData):
    name: str
    train: ImageSplit
    eval: dict[str, ImageSplit]
    classes: tuple[str, ...]
    seed: int
    crop_padding: int
    flip: bool

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.train.prepared.image_shape

    def train_batch(self, batch: Batch, step: int) -> Batch:
        rng = np.random.default_rng([self.seed, TRAIN_STREAM, step])
        if self.train.by_index:
            return {**batch, **augmentation_rows(rng, len(batch["labels"]), self.crop_padding, self.flip)}
        return {**batch, "images": augment(batch["images"], rng, self.crop_padding, self.flip)}

    @property
    def held_by(self) -> str:  # type: ignore[override]
        return "task.images_on_device" if self.train.by_index else ""

    def held(self) -> dict[str, np.ndarray]:
        return {"train_images": self.train.images_held()} if self.train.by_index else {}

    def metrics(self, split: str, outputs: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> dict[str, float]:
        """outputs: logits [N, classes]."""
        return {"accuracy": float(np.mean(outputs.argmax(axis=1) == labels)),
                "loss": float(np.mean(cross_entropy(outputs, labels)))}

    def pinned_options(self) -> dict[str, Any]:
        return {"classes": list(self.classes)}

    def report(self) -> dict[str, Any]:
        return {"classes": list(self.classes), "image_shape": list(self.image_shape),
                "prepared": self.train.prepared.shards.location}


class ImageClassification(Task):
    name: ClassVar[str] = "image_classification"
    Options: ClassVar[type] = Options
    backends: ClassVar[Mapping[str, str]] = framework_modules(__name__)
    model_kinds: ClassVar[tuple[str, ...]] = ("image", "own")
    auto_class: ClassVar[str] = "AutoModelForImageClassification"
    inputs: ClassVar[tuple[str, ...]] = ("images",)
    tokenized: ClassVar[bool] = False

    def check(self, config: Any, options: Options) -> None:
        image_files.require_pillow()
        image_size(options)
        check_held_out(config, options.validation_fraction, self.name, "images", 0.1)
        if options.crop_padding < 0:
            raise TpuplexError(f"task.crop_padding = {options.crop_padding}: use 0 (no crops) or more pixels")
        if not config.data.train_file:
            raise TpuplexError("data.train_file is empty: name a class-per-folder image tree, a .csv/.jsonl of "
                               "(path, label), or a folder tpuplex prepare wrote")
        for field, spec in (("data.train_file", config.data.train_file),
                            *((f"data.eval_files[{i}]", spec) for i, spec in enumerate(config.data.eval_files))):
            if not is_url(spec):
                existing(field, spec)

    def metric_names(self, config: Any, options: Options) -> dict[str, tuple[str, ...]]:
        return dict.fromkeys(evaluation_splits(config, lambda field, spec: Path(spec).name), ("accuracy", "loss"))

    def prepare(self, config: Any, options: Options, tokenizer_dir: Path | None) -> ImageData:
        data, size = config.data, image_size(options)
        cache = Path(data.cache_dir).expanduser() / "images"
        train = prepared_images("data.train_file", data.train_file, size, cache)
        height, width, _ = train.image_shape
        if options.crop_padding >= min(height, width):
            raise TpuplexError(f"task.crop_padding = {options.crop_padding} is not smaller than the {height}x{width} "
                               f"images: use fewer pixels than the image's side (e.g. {max(1, min(height, width) // 8)}"
                               ", as 4 for 32x32), or 0 for no crops")
        if options.classes and tuple(options.classes) != train.classes:
            raise TpuplexError(f"data.train_file = {data.train_file!r} now has the classes {list(train.classes)}, "
                               f"but task.classes (the run's) are {list(options.classes)}: give the images the "
                               "run was trained on")
        every = np.arange(len(train), dtype=np.int64)
        if data.eval_files:
            splits = {}
            check_split_names(data.eval_files, [Path(spec).name for spec in data.eval_files])
            for index, spec in enumerate(data.eval_files):
                split = prepared_images(f"data.eval_files[{index}]", spec, size, cache, train.classes)
                if split.image_shape != train.image_shape:
                    raise TpuplexError(f"data.eval_files[{index}] holds {split.image_shape} images, data.train_file "
                                       f"{train.image_shape}: set task.image_size so both are resized alike")
                splits[Path(spec).name] = ImageSplit(split, np.arange(len(split), dtype=np.int64))
            train_split = ImageSplit(train, every, options.images_on_device)
        else:
            rows, validation = held_out(train.labels, options.validation_fraction, config.train.seed)
            # Its own reader: what training reads (results.json's train_reads) is counted apart from evaluation.
            held = image_files.PreparedImages(train.shards.reopened())
            train_split = ImageSplit(train, rows, options.images_on_device)
            splits = {"validation": ImageSplit(held, validation)}
        return ImageData(data.dataset, train_split, splits, train.classes, config.train.seed, options.crop_padding,
                         options.flip)

    def head(self, family: ImageFamily | None, arch: Any, hf_config: Mapping[str, Any],
             data: ImageData) -> ClassifierHead:
        """The family's classifier is part of its plan (`arch.parameter_shapes`): the head says only its size."""
        if arch is not None:
            if arch.num_channels != 3:
                raise TpuplexError(f"the {family.name} config.json has num_channels = {arch.num_channels}, but "
                                   "images are RGB: set num_channels to 3")
            if getattr(arch, "image_size", data.image_shape[:2]) != data.image_shape[:2]:
                raise TpuplexError(f"the ViT config.json is for {list(arch.image_size)} images, the data is "
                                   f"{list(data.image_shape[:2])}: set task.image_size = {list(arch.image_size)}")
        return ClassifierHead(modules={}, shapes={}, drawn=(), num_labels=len(data.classes))

    def example_batch(self, data: ImageData) -> dict[str, np.ndarray]:
        """Two black images uint8 [2, H, W, 3] of the data's size, and labels int32 [2]."""
        return {"images": np.zeros((2, *data.image_shape), np.uint8), "labels": np.zeros(2, np.int32)}

    def model_arguments(self, data: ImageData, head: ClassifierHead, vocab_size: int) -> dict[str, Any]:
        return {"num_labels": len(data.classes), "image_shape": data.image_shape}

    def head_flops(self, spec: Any, batch: Mapping[str, np.ndarray]) -> float:
        """0: the classifier is part of the family's network (`ImageFamilies.forward_flops`)."""
        return 0.0

    def hf_class(self, family: ImageFamily, model_type: str) -> str:
        return family.hf_class

    def export_config(self, config: Any) -> dict[str, Any]:
        classes = list(config.task.options.get("classes", ()))
        return {"id2label": dict(enumerate(classes)), "label2id": {name: i for i, name in enumerate(classes)}}

    def prediction_sources(self, config: Any, split: str) -> dict[str, list[Path] | None]:
        """`tpuplex predict --split`: an evaluation split of the run (None: its prepared images), or an image
        file or folder (its images, read and resized as `tpuplex prepare` does)."""
        path = Path(split).expanduser()
        if path.exists():
            return {path.stem: image_files.image_paths(path)}
        held_out = [Path(spec).name for spec in config.data.eval_files] or ["validation"]
        if split not in held_out:
            raise TpuplexError(f"--split {split!r} is neither an evaluation split of the run ({', '.join(held_out)}) "
                               "nor an image file or folder")
        return {split: None}

    def write_predictions(self, experiment: Any, state: Any, sources: dict[str, list[Path] | None], out: Path,
                          write: bool) -> dict[str, Path]:
        """One TSV per source: the image (its path, or its index in the evaluation split), the predicted class
        index and name, and each class's probability (softmax of the logits, float64)."""
        data, trainer, written = experiment.data, experiment.trainer, {}
        for name, files in sources.items():
            if files is None:
                keys = [str(index) for index in range(len(data.eval[name]))]
                logits, _ = trainer.predict(state, trainer.batcher(data.eval[name]))
            else:
                keys, logits = list(map(str, files)), _logits_of_files(experiment, state, files, name)
            if write:
                written[name] = _write_tsv(out / f"{name}.tsv", keys, softmax(logits), data.classes)
        return written

    def prediction_inputs(self, config: Any, inputs: Sequence[Any]) -> list[Path]:
        """Image files (paths), read and resized as `tpuplex prepare` does."""
        files = [Path(file).expanduser() for file in check_inputs(inputs, str | Path, "image files: paths")]
        missing = next((file for file in files if not file.is_file()), None)
        if missing is not None:
            raise DataError(f"image {missing} {absence(missing)}: give the paths of image files")
        return files

    def predictions_of(self, experiment: Any, state: Any, inputs: list[Path]) -> list[str]:
        """Each image's class name."""
        logits = _logits_of_files(experiment, state, inputs, "inputs")
        return [experiment.data.classes[index] for index in logits.argmax(axis=1)]

    def scored_predictions_of(self, experiment: Any, state: Any, inputs: list[Path]) -> list[dict[str, Any]]:
        """Each image's class (`label`), its probability (`score`) and every class's (`scores`: the softmax of the
        logits, as the prediction files write them)."""
        logits = _logits_of_files(experiment, state, inputs, "inputs")
        return [scored_label(row, experiment.data.classes) for row in softmax(logits)]


def _logits_of_files(experiment: Any, state: Any, files: Sequence[Path], name: str) -> np.ndarray:
    """The logits [N, classes] of image files, prepared at the run's image size in a temporary folder."""
    data, trainer = experiment.data, experiment.trainer
    with tempfile.TemporaryDirectory() as folder:
        listing = image_files.ImageList(tuple(files), np.zeros(len(files), np.int32), data.classes, name)
        prepared = image_files.prepare(listing, Path(folder) / "images", data.image_shape[:2])
        logits, _ = trainer.predict(state, trainer.batcher(ImageSplit(prepared, np.arange(len(files), dtype=np.int64))))
    return logits


def image_size(options: Options) -> tuple[int, int] | None:
    """task.image_size as (H, W), or None to keep the images' own size."""
    if not options.image_size:
        return None
    if len(options.image_size) != 2 or min(options.image_size) < 1:
        raise TpuplexError(f"task.image_size = {list(options.image_size)}: give [height, width] in pixels, e.g. "
                           "[160, 160], or [] to keep the images' own size")
    return int(options.image_size[0]), int(options.image_size[1])


def is_url(spec: str) -> bool:
    """Whether `spec` is an fsspec URL (`gs://bucket/flowers-160`): a prepared folder read where it lives."""
    return "://" in spec


def existing(field: str, spec: str) -> Path:
    """`spec` as a path, which must exist; relative paths are relative to the current folder."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise TpuplexError(f"{field} = {spec!r} does not exist (relative paths start from {Path.cwd()}): give a "
                           "class-per-folder image tree, a .csv/.jsonl of (path, label), or a folder tpuplex prepare "
                           "wrote")
    return path


def prepared_images(field: str, spec: str, size: tuple[int, int] | None, cache: Path,
                    classes: tuple[str, ...] = ()) -> image_files.PreparedImages:
    """The prepared images `spec` names: a prepared folder as it is, or raw images (folder tree or listing)
    prepared into `cache` once (reused while the listing is unchanged). `classes`: the training split's, which an
    evaluation split must match."""
    path = None if is_url(spec) else existing(field, spec)
    if path is None or (path / image_files.MANIFEST).is_file():
        prepared = image_files.open_prepared(spec if path is None else path)
        if size is not None and prepared.image_shape[:2] != size:
            raise TpuplexError(f"{field} = {spec!r} was prepared at {prepared.image_shape[:2]}, but task.image_size "
                               f"is {list(size)}: prepare it again at that size or set task.image_size to match")
    else:
        listing = (image_files.scan_folder(path) if path.is_dir()
                   else image_files.read_listing(path, classes))
        folder = cache / f"{listing.key()}-{'x'.join(map(str, size)) if size else 'own'}"
        prepared = (image_files.open_prepared(folder) if (folder / image_files.MANIFEST).is_file()
                    else image_files.prepare(listing, folder, size))
    if classes and prepared.classes != classes:
        raise TpuplexError(f"{field} = {spec!r} has the classes {list(prepared.classes)}, the training images "
                           f"{list(classes)}: give every split the same class folders")
    return prepared


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities [N, C] of logits [N, C], in float64."""
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    exponent = np.exp(shifted)
    return exponent / exponent.sum(axis=1, keepdims=True)


def _write_tsv(path: Path, keys: list[str], probabilities: np.ndarray, classes: tuple[str, ...]) -> Path:
    with staged_text(path) as staging:
        staging.write("\t".join(["image", "class", "label", *classes]) + "\n")
        for key, row in zip(keys, probabilities, strict=True):
            best = int(row.argmax())
            staging.write("\t".join([key, str(best), classes[best], *(f"{p:.9g}" for p in row)]) + "\n")
    return path


TASK = ImageClassification()

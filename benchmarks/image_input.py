"""Image input speed: tpuplex's prepared shards beside a Keras `fit` on a tf.data TFRecord pipeline and a torch
DataLoader loop reading the same JPEGs, in one run.

    python benchmarks/image_input.py --steps 60 --out runs/image-input

Run it where tpuplex-core[images], tpuplex-torch and tensorflow are installed (the tests-tf nox environment). For
flowers (128 x 128, batch 32: examples/flowers/flowers.toml) and CIFAR-10 (32 x 32, batch 128:
examples/flowers/cifar10.toml) it prints one JSON line per measurement:

- prepare: `tpuplex prepare`'s images/s (decode, convert, resize, write), and the one-time TFRecord writing the
  Keras side needs (encoded JPEG bytes and label per record), images/s;
- pipeline: images/s of the input alone, with nothing training: tpuplex's batches (shards read from the page cache,
  crops and flips, the prefetch thread), the tf.data pipeline (parallel TFRecord reads, parallel decode + resize +
  flip, shuffle buffer, batch with drop_remainder, prefetch), and the DataLoader (2 workers decoding JPEGs with
  Pillow, resize, flip);
- train: `--steps` steps of the examples' CNN at the example's batch size, after 5 untimed steps: images/s and the
  input-wait share (seconds the step waited for its batch / step seconds; tpuplex and the DataLoader loop time
  the wait around their `next(batches)`; Keras `fit` does not expose it, so its line gives images/s only).

Same model everywhere (`examples/flowers/flowers_cnn`), AdamW at the config's learning rate, dropout on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tpuplex import config as config_lib
from tpuplex.data import images
from tpuplex.data.batching import Batcher
from tpuplex.engine.prefetch import Prefetcher
from tpuplex.tasks.image_classification import ImageData
from tpuplex.tasks.image_classification.data import ImageSplit

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "flowers"
DATASETS = {"flowers": EXAMPLE / "flowers.toml", "cifar10": EXAMPLE / "cifar10.toml"}


def emit(**record) -> dict:
    print(json.dumps(record), flush=True)
    return record


def settings(name: str) -> tuple[config_lib.Config, Path, tuple[int, int] | None]:
    """The example's config, its training image folder and its image size (None: the images' own)."""
    config = config_lib.load(DATASETS[name])
    folder = (DATASETS[name].parent / config.data.train_file).resolve()
    size = tuple(config.task.options.get("image_size") or ()) or None
    return config, folder, size


def tpuplex_prepare(name: str, out: Path) -> images.PreparedImages:
    _, folder, size = settings(name)
    listing = images.scan_folder(folder)
    started = time.perf_counter()
    prepared = images.prepare(listing, out / f"{name}-prepared", size)
    emit(dataset=name, measure="prepare", side="tpuplex", images=len(listing),
         images_per_s=round(len(listing) / (time.perf_counter() - started), 1))
    return prepared


def tpuplex_pipeline(name: str, prepared: images.PreparedImages, steps: int) -> None:
    config, _, _ = settings(name)
    options = config.task.options
    data = ImageData(name, ImageSplit(prepared, np.arange(len(prepared), dtype=np.int64)), {}, prepared.classes,
                     seed=config.train.seed, crop_padding=options.get("crop_padding", 0),
                     flip=options.get("flip", True))
    batcher = Batcher(data.train, config.train.global_batch, 1, seed=config.train.seed)
    batches = Prefetcher((data.train_batch(b, step) for step, b in enumerate(batcher.train_batches(0), 1)),
                         config.runtime.prefetch)
    started, count = time.perf_counter(), 0
    for _, batch in zip(range(steps), batches, strict=False):
        count += len(batch["images"])
    batches.close()
    seconds = time.perf_counter() - started
    emit(dataset=name, measure="pipeline", side="tpuplex", images_per_s=round(count / seconds, 1))


def tpuplex_train(name: str, backend: str, steps: int, out: Path) -> None:
    run_dir = out / f"{name}-{backend}"
    command = [sys.executable, "-m", "tpuplex", "train", DATASETS[name].name, "--backend", backend,
               "--set", f"train.max_steps={5 + steps}", "--set", f'runtime.output_dir="{run_dir}"',
               "--set", f'data.cache_dir="{out / "cache"}"', "--set", "runtime.log_every=5"]
    subprocess.run(command, cwd=EXAMPLE, check=True, capture_output=True, text=True,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    train = json.loads((run_dir / "results.json").read_text())["train"]
    logged = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    times = {record["step"]: record["time"] for record in logged if record["event"] == "train"}
    config, _, _ = settings(name)
    emit(dataset=name, measure="train", side=f"tpuplex {backend}", steps=steps,
         images_per_s=round(steps * config.train.global_batch / (times[5 + steps] - times[5]), 1),
         input_wait_share=train["input_wait_share"],
         note="images/s after 5 untimed steps (log times); input wait over all steps")


# --- Keras fit on tf.data --------------------------------------------------------------------------------------

def write_tfrecords(name: str, out: Path) -> list[str]:
    import tensorflow as tf

    _, folder, _ = settings(name)
    listing = images.scan_folder(folder)
    files, shards = [], 8
    started = time.perf_counter()
    order = np.random.default_rng(0).permutation(len(listing))
    for shard in range(shards):
        path = out / f"{name}-{shard}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for index in order[shard::shards]:
                feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(
                               value=[listing.paths[index].read_bytes()])),
                           "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(listing.labels[index])]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        files.append(str(path))
    emit(dataset=name, measure="prepare", side="tf.data TFRecord (JPEG bytes)", images=len(listing),
         images_per_s=round(len(listing) / (time.perf_counter() - started), 1))
    return files


def tf_dataset(name: str, files: list[str]):
    import tensorflow as tf

    config, _, size = settings(name)
    height, width = size or (32, 32)
    padding = config.task.options.get("crop_padding", 0)

    def parse(record):
        parsed = tf.io.parse_single_example(record, {"image": tf.io.FixedLenFeature([], tf.string),
                                                     "label": tf.io.FixedLenFeature([], tf.int64)})
        image = tf.image.resize(tf.io.decode_jpeg(parsed["image"], channels=3), (height, width), antialias=True)
        image = tf.image.resize_with_crop_or_pad(image, height + 2 * padding, width + 2 * padding)
        image = tf.image.random_flip_left_right(tf.image.random_crop(image, (height, width, 3)))
        return image / 255.0, parsed["label"]

    autotune = tf.data.AUTOTUNE
    return (tf.data.TFRecordDataset(files, num_parallel_reads=autotune).map(parse, num_parallel_calls=autotune)
            .shuffle(2048).repeat().batch(config.train.global_batch, drop_remainder=True).prefetch(autotune))


def keras_side(name: str, out: Path, steps: int) -> None:
    import keras

    sys.path.insert(0, str(EXAMPLE))
    from flowers_cnn.tf_model import FlowersCNN

    config, _, _ = settings(name)
    files = write_tfrecords(name, out)
    dataset = tf_dataset(name, files)
    started, count = time.perf_counter(), 0
    for images_, _ in dataset.take(steps):
        count += int(images_.shape[0])
    seconds = time.perf_counter() - started
    emit(dataset=name, measure="pipeline", side="tf.data", images_per_s=round(count / seconds, 1))
    classes = len(images.scan_folder(settings(name)[1]).classes)
    model = FlowersCNN(classes, (0, 0, 3))
    model.compile(optimizer=keras.optimizers.AdamW(config.train.learning_rate, weight_decay=config.train.weight_decay),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    model.fit(dataset, steps_per_epoch=5, epochs=1, verbose=0)
    started = time.perf_counter()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
    emit(dataset=name, measure="train", side="keras fit + tf.data", steps=steps,
         images_per_s=round(steps * config.train.global_batch / (time.perf_counter() - started), 1),
         input_wait_share=None, note="after 5 untimed steps")


# --- torch DataLoader ------------------------------------------------------------------------------------------

class JpegFolder:
    """A torch Dataset over the JPEGs as a usual script writes it: Pillow decode, RGB, Pillow's own antialiased
    bilinear resize of the centre crop (torchvision's Resize; the image's own size kept when None), then the same
    zero-padded random crop and flip, returning float32 [3, H, W] in [0, 1]."""

    def __init__(self, listing: images.ImageList, size: tuple[int, int] | None, padding: int):
        self.listing, self.size, self.padding = listing, size, padding

    def __len__(self) -> int:
        return len(self.listing)

    def __getitem__(self, index: int):
        from PIL import Image

        import torch

        with Image.open(self.listing.paths[index]) as image:
            image = image.convert("RGB")
            if self.size is not None:
                box = images.center_crop(np.zeros((image.height, image.width, 1)), self.size).shape
                left, top = (image.width - box[1]) // 2, (image.height - box[0]) // 2
                image = image.resize(self.size[::-1], Image.Resampling.BILINEAR,
                                     box=(left, top, left + box[1], top + box[0]))
            pixels = np.asarray(image)
        rng = np.random.default_rng()
        top, left = rng.integers(0, 2 * self.padding + 1, size=2)
        padded = np.pad(pixels, [(self.padding, self.padding), (self.padding, self.padding), (0, 0)])
        pixels = padded[top : top + pixels.shape[0], left : left + pixels.shape[1]]
        if rng.random() < 0.5:
            pixels = pixels[:, ::-1]
        image = torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1).float() / 255.0
        return image, int(self.listing.labels[index])


def dataloader_side(name: str, steps: int) -> None:
    import torch

    sys.path.insert(0, str(EXAMPLE))
    from flowers_cnn.torch_model import FlowersCNN

    config, folder, size = settings(name)
    listing = images.scan_folder(folder)
    dataset = JpegFolder(listing, size, config.task.options.get("crop_padding", 0))
    loader = torch.utils.data.DataLoader(dataset, batch_size=config.train.global_batch, shuffle=True, num_workers=2,
                                         drop_last=True, persistent_workers=True, prefetch_factor=4)
    batches = (batch for _ in iter(int, 1) for batch in loader)  # epoch after epoch
    started, count = time.perf_counter(), 0
    for _ in range(steps):
        count += len(next(batches)[0])
    emit(dataset=name, measure="pipeline", side="torch DataLoader (2 workers)",
         images_per_s=round(count / (time.perf_counter() - started), 1))
    model = FlowersCNN(len(listing.classes), (0, 0, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.learning_rate,
                                  weight_decay=config.train.weight_decay)
    waited = total = 0.0
    for step in range(5 + steps):
        started = time.perf_counter()
        images_, labels = next(batches)
        wait = time.perf_counter() - started
        loss = torch.nn.functional.cross_entropy(model(images_), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step >= 5:
            waited, total = waited + wait, total + time.perf_counter() - started
    emit(dataset=name, measure="train", side="torch DataLoader loop", steps=steps,
         images_per_s=round(steps * config.train.global_batch / total, 1), input_wait_share=round(waited / total, 4),
         note="after 5 untimed steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--datasets", default="flowers,cifar10")
    parser.add_argument("--out", type=Path, required=True, help="an empty folder for shards, records and runs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.datasets.split(","):
        prepared = tpuplex_prepare(name, args.out)
        tpuplex_pipeline(name, prepared, args.steps)
        for backend in ("torch", "tf"):
            tpuplex_train(name, backend, args.steps, args.out)
        keras_side(name, args.out, args.steps)
        dataloader_side(name, args.steps)


if __name__ == "__main__":
    main()

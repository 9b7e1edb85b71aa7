"""ResNet-20 on CIFAR-10: tpuplex beside the framework's usual training script, in one run, over seeds.

    python benchmarks/cifar_side_by_side.py --backend torch --seeds 1 2 3 --epochs 2 --out runs/cifar-sbs

Both sides train the same network size (He et al.'s CIFAR ResNet-20: a 3x3 stem of 16 channels, three stages of
three basic blocks of 16/32/64 channels, projection shortcuts where the shape changes, global average pooling; the
`examples/cifar10/resnet20` config) with the same recipe (AdamW 2e-3, weight decay 0.05 on neither batch norms nor
biases, cosine to 0 after a 2% warmup, batch 128, pad-4 random crops and flips) on the same images: the first
--train-per-class training and --test-per-class test images of each class of ../shared/images/cifar10.

- tpuplex: `tpuplex train examples/cifar10/resnet20.toml --backend B` on those images, prepared once into shards
  before the timed epochs (`tpuplex prepare`'s images/s is printed: the decode it does once, the others per epoch).
- the usual script, each with its own ResNet-20 and initialisation:
  torch: an `nn.Module`, a `DataLoader` (2 workers decoding the JPEGs with Pillow, crop, flip) and a training loop;
  tf: a Keras functional model, `model.fit` on a `tf.data` pipeline (parallel read + decode + crop + flip,
  shuffle, batch, prefetch);
  jax: a Flax linen model, an optax AdamW and a jitted train step over `TrainState`, fed by a torch `DataLoader` (the
  JAX documentation's data-loading recipe, the Flax examples' structure).
  With `--usual-init hf` their convolutions are drawn as HF's ResNet (and so tpuplex) draws them: Kaiming-normal
  over fan_out, instead of each framework's default.

Printed per seed and side: training images/s over all epochs (input included, evaluation excluded) and test
accuracy after the last epoch; then the mean and sample std of each, and the ratio tpuplex / usual.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CIFAR = ROOT.parent / "shared" / "images" / "cifar10"
EXAMPLE = ROOT / "examples" / "cifar10" / "resnet20.toml"
WIDTHS, DEPTH, BATCH, LEARNING_RATE, WEIGHT_DECAY, WARMUP = (16, 32, 64), 3, 128, 2e-3, 0.05, 0.02


def listing(split: str, per_class: int, out: Path) -> Path:
    """A (path, label) CSV of the first `per_class` images of each class of the split."""
    path = out / f"{split}-{per_class}.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label"])
        for folder in sorted(p for p in (CIFAR / split).iterdir() if p.is_dir()):
            for image in sorted(folder.glob("*.jpg"))[:per_class]:
                writer.writerow([str(image), folder.name])
    return path


def rows(path: Path) -> tuple[list[str], np.ndarray, list[str]]:
    """(paths, labels int32, classes) of a listing."""
    with path.open() as handle:
        entries = list(csv.DictReader(handle))
    classes = sorted({entry["label"] for entry in entries})
    return ([entry["path"] for entry in entries],
            np.array([classes.index(entry["label"]) for entry in entries], np.int32), classes)


def learning_rate(step: int, total: int) -> float:
    """Linear warmup over WARMUP of the steps, then cosine to 0 (tpuplex.engine.schedule's cosine)."""
    warmup = max(1, math.ceil(total * WARMUP))
    if step < warmup:
        return LEARNING_RATE * step / warmup
    return LEARNING_RATE * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def emit(**record) -> dict:
    print(json.dumps(record), flush=True)
    return record


# --- tpuplex ----------------------------------------------------------------------------------------------------

def tpuplex_side(backend: str, seed: int, epochs: int, train: Path, test: Path, out: Path) -> dict:
    run = out / f"tpuplex-{backend}-{seed}"
    sets = {"train.epochs": epochs, "train.seed": seed, "data.train_file": str(train), "data.eval_files": [str(test)],
            "runtime.output_dir": str(run), "data.cache_dir": str(out / "cache"), "runtime.log_every": 20}
    command = [sys.executable, "-m", "tpuplex", "train", EXAMPLE.name, "--backend", backend,
               *(part for key, value in sets.items() for part in ("--set", f"{key}={json.dumps(value)}"))]
    started = time.perf_counter()
    subprocess.run(command, cwd=EXAMPLE.parent, check=True, capture_output=True, text=True,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    results = json.loads((run / "results.json").read_text())
    [metrics] = results["metrics"].values()
    return emit(side=f"tpuplex {backend}", seed=seed, images_per_s=results["train"]["examples_per_s"],
                accuracy=metrics["accuracy"], input_wait_share=results["train"]["input_wait_share"],
                wall_s=round(time.perf_counter() - started, 1))


# --- the torch DataLoader (torch and jax scripts) ------------------------------------------------------------

class JpegDataset:
    """JPEGs decoded with Pillow per item; training items zero-padded by 4, cropped back at random and flipped.
    Items: uint8 [32, 32, 3] and the label."""

    def __init__(self, paths: list[str], labels: np.ndarray, augment: bool):
        self.paths, self.labels, self.augment = paths, labels, augment

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        from PIL import Image

        with Image.open(self.paths[index]) as image:
            pixels = np.asarray(image.convert("RGB"))
        if self.augment:
            rng = np.random.default_rng()
            top, left = rng.integers(0, 9, size=2)
            pixels = np.pad(pixels, [(4, 4), (4, 4), (0, 0)])[top : top + 32, left : left + 32]
            if rng.random() < 0.5:
                pixels = pixels[:, ::-1]
        return np.array(pixels), int(self.labels[index])  # a writable copy, as torch wants


def loader(paths: list[str], labels: np.ndarray, train: bool, seed: int, context: str | None = None):
    """Batches of BATCH (the last shorter), shuffled for training, decoded by 2 worker processes (`context`
    "spawn" where the parent runs threads that must not be forked: JAX's)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(JpegDataset(paths, labels, train), batch_size=BATCH, shuffle=train,
                                       num_workers=2, persistent_workers=True, generator=generator,
                                       multiprocessing_context=context)


# --- torch ------------------------------------------------------------------------------------------------------

def torch_side(seed: int, epochs: int, train: Path, test: Path, hf_init: bool) -> dict:
    import torch
    from torch import nn

    torch.manual_seed(seed)

    def conv_bn(cin: int, cout: int, kernel: int, stride: int) -> nn.Sequential:
        return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout))

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.first, self.second = conv_bn(cin, cout, 3, stride), conv_bn(cout, cout, 3, 1)
            self.shortcut = conv_bn(cin, cout, 1, stride) if (cin, stride) != (cout, 1) else nn.Identity()

        def forward(self, x):
            return torch.relu(self.second(torch.relu(self.first(x))) + self.shortcut(x))

    layers, cin = [conv_bn(3, WIDTHS[0], 3, 1), nn.ReLU()], WIDTHS[0]
    for stage, width in enumerate(WIDTHS):
        for block in range(DEPTH):
            layers.append(Block(cin, width, 2 if stage and not block else 1))
            cin = width
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10))
    if hf_init:
        for module in model.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    model = model.to(memory_format=torch.channels_last)
    decay = [p for p in model.parameters() if p.ndim > 1]
    rest = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": rest, "weight_decay": 0.0}], lr=LEARNING_RATE)
    train_paths, train_labels, _ = rows(train)
    batches = loader(train_paths, train_labels, True, seed)
    total, step = epochs * len(batches), 0

    def inputs(images):
        return images.permute(0, 3, 1, 2).float().div(255).contiguous(memory_format=torch.channels_last)

    seconds = 0.0
    model.train()
    for _ in range(epochs):
        started = time.perf_counter()
        for images, labels in batches:
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, total)
            loss = nn.functional.cross_entropy(model(inputs(images)), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
        seconds += time.perf_counter() - started
    model.eval()
    correct = 0
    test_paths, test_labels, _ = rows(test)
    with torch.no_grad():
        for images, labels in loader(test_paths, test_labels, False, seed):
            correct += int((model(inputs(images)).argmax(-1) == labels).sum())
    return emit(side="torch DataLoader loop", seed=seed, images_per_s=round(epochs * len(train_paths) / seconds, 1),
                accuracy=correct / len(test_paths))


# --- Keras fit on tf.data ---------------------------------------------------------------------------------------

def keras_resnet20(hf_init: bool = False):
    """The Keras functional ResNet-20: images float32 [B, 32, 32, 3] in [0, 1] -> logits [B, 10]."""
    import keras

    layers = keras.layers
    # HF's ResNet draws convolutions Kaiming-normal over fan_out; Keras' default is Glorot-uniform.
    kernel_init = (keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal") if hf_init
                   else "glorot_uniform")

    def conv_bn(x, width: int, kernel: int, stride: int):
        x = layers.Conv2D(width, kernel, stride, padding="same", use_bias=False, kernel_initializer=kernel_init)(x)
        return layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)

    inputs = keras.Input((32, 32, 3))
    x, cin = layers.ReLU()(conv_bn(inputs, WIDTHS[0], 3, 1)), WIDTHS[0]
    for stage, width in enumerate(WIDTHS):
        for block in range(DEPTH):
            stride = 2 if stage and not block else 1
            out = conv_bn(layers.ReLU()(conv_bn(x, width, 3, stride)), width, 3, 1)
            shortcut = conv_bn(x, width, 1, stride) if (cin, stride) != (width, 1) else x
            x, cin = layers.ReLU()(out + shortcut), width
    return keras.Model(inputs, layers.Dense(10)(layers.GlobalAveragePooling2D()(x)))


def keras_side(seed: int, epochs: int, train: Path, test: Path, hf_init: bool) -> dict:
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    model = keras_resnet20(hf_init)
    train_paths, train_labels, _ = rows(train)
    steps = epochs * math.ceil(len(train_paths) / BATCH)
    warmup = max(1, math.ceil(steps * WARMUP))
    schedule = keras.optimizers.schedules.CosineDecay(0.0, steps - warmup, warmup_target=LEARNING_RATE,
                                                      warmup_steps=warmup)
    optimizer = keras.optimizers.AdamW(schedule, weight_decay=WEIGHT_DECAY)
    optimizer.exclude_from_weight_decay(var_names=["gamma", "beta", "bias"])
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    def decode(path, label):
        return tf.io.decode_jpeg(tf.io.read_file(path), channels=3), label

    def augment(image, label):
        image = tf.image.random_crop(tf.pad(image, [[4, 4], [4, 4], [0, 0]]), (32, 32, 3))
        return tf.cast(tf.image.random_flip_left_right(image), tf.float32) / 255.0, label

    autotune = tf.data.AUTOTUNE
    train_data = (tf.data.Dataset.from_tensor_slices((train_paths, train_labels)).shuffle(len(train_paths), seed=seed)
                  .map(decode, num_parallel_calls=autotune).map(augment, num_parallel_calls=autotune)
                  .batch(BATCH).prefetch(autotune))
    test_paths, test_labels, _ = rows(test)
    test_data = (tf.data.Dataset.from_tensor_slices((test_paths, test_labels)).map(decode, num_parallel_calls=autotune)
                 .map(lambda image, label: (tf.cast(image, tf.float32) / 255.0, label)).batch(BATCH).prefetch(autotune))
    started = time.perf_counter()
    model.fit(train_data, epochs=epochs, verbose=0)
    seconds = time.perf_counter() - started
    _, accuracy = model.evaluate(test_data, verbose=0)
    return emit(side="keras fit + tf.data", seed=seed, images_per_s=round(epochs * len(train_paths) / seconds, 1),
                accuracy=float(accuracy))


# --- Flax -------------------------------------------------------------------------------------------------------

def flax_side(seed: int, epochs: int, train: Path, test: Path, hf_init: bool) -> dict:
    import jax.numpy as jnp
    import optax
    from flax import linen as nn
    from flax.training import train_state

    import jax

    kernel_init = (nn.initializers.variance_scaling(2.0, "fan_out", "normal") if hf_init
                   else nn.initializers.lecun_normal())

    class ConvBN(nn.Module):
        width: int
        kernel: int
        stride: int

        @nn.compact
        def __call__(self, x, train: bool):
            x = nn.Conv(self.width, (self.kernel,) * 2, self.stride, padding="SAME", use_bias=False,
                        kernel_init=kernel_init)(x)
            return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5)(x)

    class ResNet20(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool):
            x, cin = nn.relu(ConvBN(WIDTHS[0], 3, 1)(x, train)), WIDTHS[0]
            for stage, width in enumerate(WIDTHS):
                for block in range(DEPTH):
                    stride = 2 if stage and not block else 1
                    out = ConvBN(width, 3, 1)(nn.relu(ConvBN(width, 3, stride)(x, train)), train)
                    shortcut = ConvBN(width, 1, stride)(x, train) if (cin, stride) != (width, 1) else x
                    x, cin = nn.relu(out + shortcut), width
            return nn.Dense(10)(x.mean(axis=(1, 2)))

    class TrainState(train_state.TrainState):
        batch_stats: dict

    train_paths, train_labels, _ = rows(train)
    batches = loader(train_paths, train_labels, True, seed, "spawn")
    total = epochs * len(batches)
    warmup = max(1, math.ceil(total * WARMUP))
    schedule = optax.warmup_cosine_decay_schedule(0.0, LEARNING_RATE, warmup, total)
    model = ResNet20()
    variables = model.init(jax.random.key(seed), jnp.zeros((1, 32, 32, 3)), train=False)
    decay_mask = jax.tree_util.tree_map(lambda p: p.ndim > 1, variables["params"])
    state = TrainState.create(apply_fn=model.apply, params=variables["params"], batch_stats=variables["batch_stats"],
                              tx=optax.adamw(schedule, weight_decay=WEIGHT_DECAY, mask=decay_mask))

    @jax.jit
    def train_step(state, images, labels):
        def loss_fn(params):
            logits, updates = state.apply_fn({"params": params, "batch_stats": state.batch_stats},
                                             images.astype(jnp.float32) / 255.0, train=True, mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), updates

        grads, updates = jax.grad(loss_fn, has_aux=True)(state.params)
        return state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"])

    @jax.jit
    def predict(state, images):
        return state.apply_fn({"params": state.params, "batch_stats": state.batch_stats},
                              images.astype(jnp.float32) / 255.0, train=False).argmax(-1)

    seconds = 0.0
    for _ in range(epochs):
        started = time.perf_counter()
        for images, labels in batches:
            state = train_step(state, jnp.asarray(images.numpy()), jnp.asarray(labels.numpy()))
        jax.block_until_ready(state.params)
        seconds += time.perf_counter() - started
    test_paths, test_labels, _ = rows(test)
    correct = sum(int((np.asarray(predict(state, jnp.asarray(images.numpy()))) == labels.numpy()).sum())
                  for images, labels in loader(test_paths, test_labels, False, seed, "spawn"))
    return emit(side="flax loop + DataLoader", seed=seed, images_per_s=round(epochs * len(train_paths) / seconds, 1),
                accuracy=correct / len(test_paths))


USUAL = {"torch": torch_side, "tf": keras_side, "jax": flax_side}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=sorted(USUAL), required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-per-class", type=int, default=1000)
    parser.add_argument("--test-per-class", type=int, default=200)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--usual-init", choices=("framework", "hf"), default="framework",
                        help="the usual script's convolutions: its framework's default initialisation, or HF's "
                             "ResNet's (Kaiming-normal over fan_out, what tpuplex draws)")
    args = parser.parse_args()
    args.out = args.out.resolve()  # tpuplex runs from the example's folder
    args.out.mkdir(parents=True, exist_ok=True)
    train, test = listing("train", args.train_per_class, args.out), listing("test", args.test_per_class, args.out)
    from tpuplex.data import images

    prepared = args.out / "prepared-train"
    if not prepared.exists():
        started = time.perf_counter()
        images.prepare(images.read_listing(train), prepared, None)
        emit(side="tpuplex prepare", images_per_s=round(10 * args.train_per_class / (time.perf_counter() - started)))
    results: dict[str, list[dict]] = {}
    for seed in args.seeds:  # interleaved, so a drift of the machine's speed touches both sides alike
        results.setdefault("tpuplex", []).append(tpuplex_side(args.backend, seed, args.epochs, prepared, test,
                                                              args.out))
        results.setdefault("usual", []).append(USUAL[args.backend](seed, args.epochs, train, test,
                                                                     args.usual_init == "hf"))
    summary = {}
    for side, found in results.items():
        for key in ("images_per_s", "accuracy"):
            values = [entry[key] for entry in found]
            summary[f"{side} {key}"] = (statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0)
    emit(backend=args.backend, epochs=args.epochs, seeds=args.seeds, summary=summary,
         speed_ratio=round(summary["tpuplex images_per_s"][0] / summary["usual images_per_s"][0], 3))


if __name__ == "__main__":
    main()

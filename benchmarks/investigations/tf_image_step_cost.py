"""Where tpuplex-tf's ResNet-20 step stands against Keras `fit`'s: each side's step and its forward + backward pass.

    python benchmarks/investigations/tf_image_step_cost.py --rounds 5   # in .nox/tests-tf

Builds, in one process, on the first 100 training images of each CIFAR-10 class (prepared once into shards):
- tpuplex-tf's whole step (`Steps.train`, what `tpuplex train examples/cifar10/resnet20.toml` calls) and its
  forward and backward pass (`Steps._replica_gradients_program`);
- the Keras functional ResNet-20 of `benchmarks/cifar_side_by_side.py` compiled as that script compiles it: `fit`'s
  train function over a `tf.data` pipeline of the same four batches (pixels already scaled, so no input work is
  timed on either side), and its forward and backward pass (`tf.GradientTape` in a `tf.function`).
Both are batch 128, float32, XLA off (Keras' "auto" leaves XLA off on CPU-only hosts; tpuplex's default on CPUs).
Warms each side up for two calls, then times `--steps` calls of each side in turn, `--rounds` rounds, so machine
noise hits every side alike (`round_robin.time_in_turn`). Prints each side's median ms per call and its CPU time.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for the side-by-side's Keras model
from cifar_side_by_side import BATCH, EXAMPLE, keras_resnet20, listing  # noqa: E402
from round_robin import print_medians, time_in_turn  # noqa: E402

from tpuplex import config as config_lib  # noqa: E402
from tpuplex.commands import run  # noqa: E402
from tpuplex.data import images  # noqa: E402

LEARNING_RATE = 1e-3


def tpuplex_sides(work: Path, per_class: int) -> tuple[dict[str, Callable[[int], object]], list[dict]]:
    """tpuplex-tf's step and its forward + backward; (name -> call(i), the 4 batches they cycle through)."""
    prepared = work / "prepared"
    images.prepare(images.read_listing(listing("train", per_class, work)), prepared, None)
    test = listing("test", 1, work)
    config = config_lib.load(EXAMPLE, [f'data.train_file="{prepared}"', f'data.eval_files=["{test}"]',
                                       f'data.cache_dir="{work / "cache"}"', f'runtime.output_dir="{work / "run"}"'])
    os.chdir(EXAMPLE.parent)
    experiment = run.prepare(config, "tf", str(EXAMPLE))
    batches = list(itertools.islice(experiment.trainer.train_batcher.train_batches(epoch=0), 4))
    steps = experiment.state.steps
    tensors = [{key: tf.constant(value) for key, value in batch.items()} for batch in batches]
    seed = tf.constant([1, 2], tf.int32)
    return {"tpuplex step": lambda i: steps.train([batches[i % 4]], [LEARNING_RATE]),
            "tpuplex forward + backward": lambda i: steps._replica_gradients_program(tensors[i % 4], seed)}, batches


def keras_sides(batches: list[dict]) -> dict[str, Callable[[int], object]]:
    """The side-by-side's Keras model: `fit`'s step and its forward + backward on the same batches."""
    model = keras_resnet20()
    model.compile(optimizer=keras.optimizers.AdamW(LEARNING_RATE, weight_decay=0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    features = [(np.asarray(b["images"], np.float32) / 255.0, np.asarray(b["labels"], np.int32)) for b in batches]
    dataset = tf.data.Dataset.from_tensor_slices(tuple(np.concatenate(parts) for parts in zip(*features, strict=True)))
    iterator = iter(dataset.batch(BATCH).repeat())
    model.make_train_function()  # Keras 3 keeps it as `model.train_function`
    train_function = model.train_function

    @tf.function
    def forward_backward(pixels, labels):
        with tf.GradientTape() as tape:
            logits = model(pixels, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        return tape.gradient(loss, model.trainable_variables)

    return {"keras fit step": lambda i: train_function(iterator),
            "keras forward + backward": lambda i: forward_backward(*features[i % 4])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="calls of each side per round")
    parser.add_argument("--per-class", type=int, default=100, help="training images of each class to prepare")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        sides, batches = tpuplex_sides(Path(work), args.per_class)
        sides.update(keras_sides(batches))
        costs = time_in_turn({name: _finished(call) for name, call in sides.items()}, args.rounds, args.steps)
    print_medians(costs, base="keras fit step")


def _finished(call: Callable[[int], object]) -> Callable[[int], None]:
    """`call` that returns once every tensor of its result has been computed (read back to the host)."""

    def finished(i: int) -> None:
        for value in tf.nest.flatten(call(i), expand_composites=True):
            if isinstance(value, (tf.Tensor, tf.Variable)) or hasattr(value, "numpy"):
                value.numpy()

    return finished


if __name__ == "__main__":
    main()

"""Where tpuplex-tf's fixed-shape step loses to Keras `fit`: each side's step, split into its parts.

    python benchmarks/investigations/tf_step_cost.py --data-dir ../shared/glue/MRPC  # in .nox/speed-tf

Builds, in one process, at the fixed [32, 128] shape of `mrpc.toml`:
- tpuplex-tf's whole step (`Steps.train`, what `tpuplex train` calls), with dropout on and off, and its parts:
  the forward and backward pass (`Steps._replica_gradients`, embedding gradients made dense) and clip + AdamW
  (`Steps._adamw`);
- transformers 4.57's `TFBertForSequenceClassification` as run_glue.py (TF) trains it: Keras' `train_function`
  (one `fit` step), with dropout on and off, and its parts: the forward and backward pass (`tf.GradientTape` in a
  `tf.function`, embedding gradients left as IndexedSlices) and `create_optimizer`'s AdamWeightDecay with global
  clipnorm (`apply_gradients`).
Warms each side up for two calls, then times three calls of each side in turn, three rounds, so machine noise hits
every side alike. Prints each side's median ms per call and its CPU time per call (cores kept busy, the kernel's
share, minor page faults). Nothing is written.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import tensorflow as tf
from round_robin import (  # benchmarks/investigations/ is on sys.path when this script runs
    CONFIG,
    arguments,
    fixed_shape_experiment,
    print_medians,
    time_in_turn,
)

from tpuplex import checkpoints
from tpuplex import config as config_lib

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
LEARNING_RATE = 1e-5


def tpuplex_sides(data_dir: str, dropout: bool) -> tuple[dict[str, Callable[[int], object]], list[dict]]:
    """tpuplex-tf's step and, with dropout on, its parts; (name -> call(i), the 4 batches they cycle through)."""
    experiment, batches = fixed_shape_experiment("tf", data_dir, dropout)
    steps = experiment.state.steps
    suffix = "" if dropout else ", no dropout"
    sides: dict[str, Callable[[int], object]] = {
        f"tpuplex step{suffix}": lambda i: steps.train([batches[i % 4]], [LEARNING_RATE])}
    if not dropout:
        return sides, batches
    tensors = [{key: tf.constant(np.asarray(b[key], np.float32 if key == "weight" else np.int32))
                for key in (*MODEL_INPUTS, "labels", "weight")} for b in batches]
    seed = tf.constant([1, 2], tf.int32)
    gradients, _, _ = steps._replica_gradients_xla(tensors[0], seed)

    def adamw(i: int) -> object:
        return steps._adamw_xla([v.read_value() for v in steps.variables], [m.read_value() for m in steps.exp_avg],
                                [v.read_value() for v in steps.exp_avg_sq], gradients, LEARNING_RATE,
                                steps.step + 1)

    sides.update({"tpuplex forward + backward": lambda i: steps._replica_gradients_xla(tensors[i % 4], seed),
                  "tpuplex clip + AdamW": adamw})
    return sides, batches


def keras_sides(batches: list[dict], dropout: bool) -> dict[str, Callable[[int], object]]:
    """run_glue.py (TF)'s model, optimizer and `fit` step and, with dropout on, its parts."""
    from transformers import TFBertForSequenceClassification, create_optimizer

    checkpoint = checkpoints.resolve_checkpoint(config_lib.load(CONFIG).model.checkpoint)
    rates = {} if dropout else {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    model = TFBertForSequenceClassification.from_pretrained(checkpoint, num_labels=2, from_pt=True, **rates)
    optimizer, _ = create_optimizer(LEARNING_RATE, 1000, 100, weight_decay_rate=0.01, adam_global_clipnorm=1.0)
    model.compile(optimizer=optimizer)
    features = [({key: np.asarray(b[key], np.int32) for key in MODEL_INPUTS}, np.asarray(b["labels"], np.int32))
                for b in batches]
    spec = tf.TensorSpec([None, None], tf.int32)
    dataset = tf.data.Dataset.from_generator(lambda: itertools.cycle(features), output_signature=(
        {key: spec for key in MODEL_INPUTS}, tf.TensorSpec([None], tf.int32)))
    iterator = iter(dataset)
    train_function = model.make_train_function()
    suffix = "" if dropout else ", no dropout"
    sides: dict[str, Callable[[int], object]] = {f"keras fit step{suffix}": lambda i: train_function(iterator)}
    if not dropout:
        return sides

    @tf.function
    def forward_backward(inputs, labels):
        with tf.GradientTape() as tape:
            logits = model(**inputs, training=True).logits
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        return tape.gradient(loss, model.trainable_variables)

    gradients = forward_backward(*features[0])

    @tf.function
    def apply() -> None:
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

    sides.update({"keras forward + backward": lambda i: forward_backward(*features[i % 4]),
                  "keras clip + AdamWeightDecay": lambda i: apply()})
    return sides


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    sides, batches = tpuplex_sides(args.data_dir, dropout=True)
    sides.update(tpuplex_sides(args.data_dir, dropout=False)[0])
    sides.update(keras_sides(batches, dropout=True))
    sides.update(keras_sides(batches, dropout=False))
    times = time_in_turn({name: _finished(call) for name, call in sides.items()}, args.rounds, args.steps)
    print_medians(times)


def _finished(call: Callable[[int], object]) -> Callable[[int], None]:
    """`call` that returns once every tensor of its result has been computed (read back to the host)."""

    def finished(i: int) -> None:
        for value in tf.nest.flatten(call(i), expand_composites=True):
            if isinstance(value, (tf.Tensor, tf.Variable)):
                value.numpy()

    return finished


if __name__ == "__main__":
    main()

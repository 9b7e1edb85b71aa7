"""Evaluation on 8 replicas counts every example once, whatever the split size; compiled programs stay bounded."""

from __future__ import annotations

import numpy as np
from helpers import backend, batch_of, encoded_split, model_spec

from tpuplex.data.batching import Batcher
from tpuplex.protocol import OptimizerSpec


def gathered_predictions(jax_backend, state, batcher: Batcher, num_labels: int) -> tuple[np.ndarray, np.ndarray]:
    """Logits per example in split order, gathered by EvalBatch.index, and how often each example was seen."""
    logits = np.zeros((len(batcher.data), num_labels), np.float32)
    seen = np.zeros(len(batcher.data), np.int64)
    for evaluation in batcher.eval_batches():
        batch_logits = jax_backend.predict(state, evaluation.batch)
        assert batch_logits.shape == (batcher.global_batch, num_labels)
        real = evaluation.index >= 0
        np.testing.assert_array_equal(real, evaluation.batch["weight"] > 0)
        logits[evaluation.index[real]] = batch_logits[real]
        np.add.at(seen, evaluation.index[real], 1)
    return logits, seen


def test_split_not_a_multiple_of_the_batch_counts_every_example_once(tiny_dir):
    spec = model_spec(tiny_dir)
    data = encoded_split(37)  # 37 = 2 x 16 + 5: the last batch of each bucket is padded
    jax_backend = backend(8)
    state = jax_backend.init(spec, OptimizerSpec())
    logits, seen = gathered_predictions(jax_backend, state, Batcher(data, 16, 8, buckets=(8,)), spec.num_labels)
    np.testing.assert_array_equal(seen, 1)
    single = backend(1)
    unpadded = single.predict(single.init(spec, OptimizerSpec()), batch_of(data))
    np.testing.assert_allclose(logits, unpadded, atol=1e-5, rtol=0)


def test_compiled_programs_are_train_plus_predict_buckets_and_stop_growing(tiny_dir):
    spec = model_spec(tiny_dir)
    data = encoded_split(80, max_length=16)
    buckets = (8,)  # lengths 8 and 16
    train_batcher = Batcher(data, 16, 8, buckets=buckets, seed=0)
    eval_batcher = Batcher(encoded_split(21, max_length=16, seed=5), 16, 8, buckets=buckets)
    jax_backend = backend(8)
    state = jax_backend.init(spec, OptimizerSpec())
    assert jax_backend.compile_count() == 0

    def epoch(number: int) -> set[int]:
        nonlocal state
        lengths = set()
        for batch in train_batcher.train_batches(number):
            state, _ = jax_backend.train_step(state, batch, 1e-3)
            lengths.add(batch["input_ids"].shape[1])
        gathered_predictions(jax_backend, state, eval_batcher, spec.num_labels)
        return lengths

    train_lengths = epoch(0)
    eval_lengths = {e.batch["input_ids"].shape[1] for e in eval_batcher.eval_batches()}
    assert train_lengths == eval_lengths == {8, 16}  # the data exercises both buckets
    after_first_epoch = jax_backend.compile_count()
    assert after_first_epoch == len(train_lengths) + len(eval_lengths)
    epoch(1)
    assert jax_backend.compile_count() == after_first_epoch

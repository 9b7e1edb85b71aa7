"""Training-step semantics on one device: steps_per_execution, grad accumulation, no retracing, profiler."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import model_spec, random_split

from tpuplex.config import RuntimeConfig
from tpuplex.data.batching import Batcher
from tpuplex.protocol import OptimizerSpec
from tpuplex_tf.backend import TfBackend


@pytest.fixture(scope="module")
def backend():
    return TfBackend(RuntimeConfig(cpu_devices=1))


def test_train_steps_equal_repeated_train_step(backend, tiny_dir):
    spec = model_spec(tiny_dir, dropout=True)
    batches = list(Batcher(random_split(48, 16), 8, 1, seed=1).train_batches(epoch=0))[:3]
    rates = [1e-3, 2e-3, 5e-4]
    looped = backend.init(spec, OptimizerSpec())
    looped_losses = []
    for batch, rate in zip(batches, rates, strict=True):
        looped, loss = backend.train_step(looped, batch, rate)
        looped_losses.append(loss)
    fused, fused_losses = backend.train_steps(backend.init(spec, OptimizerSpec()), batches, rates)
    np.testing.assert_allclose(fused_losses, looped_losses, rtol=1e-6)
    expected, got = backend.state_to_arrays(looped), backend.state_to_arrays(fused)
    assert expected.step == got.step == 3
    for name in spec.params:
        np.testing.assert_allclose(got.params[name], expected.params[name], atol=1e-7, err_msg=name)


def test_grad_accum_equals_the_whole_batch(backend, tiny_dir):
    spec = model_spec(tiny_dir)
    batch = next(Batcher(random_split(16, 16), 16, 1).train_batches(epoch=0))
    results = []
    for accum in (1, 4):
        state, loss = backend.train_step(backend.init(spec, OptimizerSpec(grad_accum=accum)), batch, 1e-3)
        results.append((backend.state_to_arrays(state).params, loss))
    (whole, whole_loss), (accumulated, accumulated_loss) = results
    assert accumulated_loss == pytest.approx(whole_loss, rel=1e-6)
    for name in spec.params:
        np.testing.assert_allclose(accumulated[name], whole[name], atol=1e-6, err_msg=name)


def test_dropout_changes_the_step_and_is_seeded(backend, tiny_dir):
    batch = next(Batcher(random_split(8, 16), 8, 1).train_batches(epoch=0))
    losses = {}
    for dropout, seed in ((False, 0), (True, 0), (True, 0), (True, 1)):
        state = backend.init(model_spec(tiny_dir, dropout=dropout), OptimizerSpec(seed=seed))
        losses.setdefault((dropout, seed), []).append(backend.train_step(state, batch, 1e-3)[1])
    assert losses[(True, 0)][0] == losses[(True, 0)][1]  # the same seed draws the same masks
    assert losses[(True, 0)][0] != losses[(False, 0)][0]
    assert losses[(True, 0)][0] != losses[(True, 1)][0]


def test_programs_are_train_buckets_plus_predict_buckets_and_do_not_grow(tiny_dir):
    backend = TfBackend(RuntimeConfig(cpu_devices=1))  # its own backend: compile_count counts every program
    train = Batcher(random_split(64, 16, seed=2), 8, 1, buckets=(8,), seed=0)
    evaluation = Batcher(random_split(20, 16, seed=3), 8, 1, buckets=(8,))
    train_lengths = {b["input_ids"].shape[1] for b in train.train_batches(epoch=0)}
    eval_lengths = {e.batch["input_ids"].shape[1] for e in evaluation.eval_batches()}
    assert train_lengths == eval_lengths == {8, 16}
    state = backend.init(model_spec(tiny_dir), OptimizerSpec())

    def epoch(number: int, steps_per_execution: int):
        nonlocal state
        batches = train.train_batches(epoch=number)
        # steps_per_execution groups consecutive batches of one shape, as the Trainer does.
        for _, group in itertools.groupby(batches, key=lambda b: b["input_ids"].shape):
            group = list(group)
            for start in range(0, len(group), steps_per_execution):
                chunk = group[start:start + steps_per_execution]
                state, _ = backend.train_steps(state, chunk, [1e-4] * len(chunk))
        for e in evaluation.eval_batches():
            backend.predict(state, e.batch)

    epoch(0, steps_per_execution=1)
    after_first = backend.compile_count()
    assert after_first == len(train_lengths) + len(eval_lengths)
    epoch(1, steps_per_execution=1)
    epoch(2, steps_per_execution=3)  # another k runs the same program: k is data, not shape
    assert backend.compile_count() == after_first


def test_profiler_window_writes_a_trace(backend, tiny_dir, tmp_path):
    state = backend.init(model_spec(tiny_dir), OptimizerSpec())
    batch = next(Batcher(random_split(8, 16), 8, 1).train_batches(epoch=0))
    backend.start_profile(tmp_path)
    backend.train_step(state, batch, 1e-3)
    backend.stop_profile()
    # Where TensorBoard's profile plugin looks: <logdir>/plugins/profile/<run>/<host>.xplane.pb
    traces = list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))
    assert traces and all(trace.stat().st_size > 0 for trace in traces)

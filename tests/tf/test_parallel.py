"""Data parallelism: MirroredStrategy over 8 logical CPUs against OneDeviceStrategy with the whole batch."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import LOGICAL_CPUS, model_spec, random_split

from tpuplex.config import RuntimeConfig
from tpuplex.data.batching import Batcher
from tpuplex.errors import TpuplexError
from tpuplex.protocol import OptimizerSpec
from tpuplex_tf.backend import TfBackend

GLOBAL_BATCH = 16


@pytest.fixture(scope="module")
def backends():
    one, many = TfBackend(RuntimeConfig(cpu_devices=1)), TfBackend(RuntimeConfig(cpu_devices=LOGICAL_CPUS))
    assert (one.topology().device_count, many.topology().device_count) == (1, LOGICAL_CPUS)
    assert "OneDeviceStrategy" in one.topology().detail and "MirroredStrategy" in many.topology().detail
    return one, many


def test_data_parallel_steps_equal_one_device(backends, tiny_dir):
    spec, optimizer = model_spec(tiny_dir), OptimizerSpec(weight_decay=0.01, clip_norm=0.5)
    # Shuffled batches: the last holds 8 real rows and 8 of weight 0, so half the replicas carry no weight.
    batcher = Batcher(random_split(40, 16), GLOBAL_BATCH, LOGICAL_CPUS, seed=0, group_by_length=False)
    batches = list(batcher.train_batches(epoch=0))
    assert len(batches) == 3 and batches[-1]["weight"].tolist() == [1.0] * 8 + [0.0] * 8
    results = []
    for backend in backends:
        state = backend.init(spec, optimizer)
        state, losses = backend.train_steps(state, batches, [1e-3, 5e-4, 2.5e-4])
        results.append((backend.state_to_arrays(state), losses))
    (single, single_losses), (mirrored, mirrored_losses) = results
    assert single.step == mirrored.step == 3
    np.testing.assert_allclose(mirrored_losses, single_losses, rtol=1e-5)
    moved = max(np.abs(single.params[name] - spec.params[name]).max() for name in spec.params)
    assert moved > 1e-4  # the steps really changed the parameters
    for name in spec.params:
        np.testing.assert_allclose(mirrored.params[name], single.params[name], atol=1e-5, err_msg=name)
        np.testing.assert_allclose(mirrored.exp_avg[name], single.exp_avg[name], atol=1e-7, err_msg=name)


def test_evaluation_counts_every_example_once_on_8_devices(backends, tiny_dir):
    one, many = backends
    spec = model_spec(tiny_dir)
    split = random_split(37, 16, seed=5)  # 37 = 2 * 16 + 5: the last batch is mostly padding
    unpadded = one.predict(one.init(spec, OptimizerSpec()), {
        "input_ids": split.input_ids, "token_type_ids": split.token_type_ids,
        "attention_mask": (np.arange(split.max_length)[None, :] < split.lengths[:, None]).astype(np.int32)})
    state = many.init(spec, OptimizerSpec())
    gathered = np.full((len(split), spec.num_labels), np.nan, np.float32)
    seen = np.zeros(len(split), int)
    for evaluation in Batcher(split, GLOBAL_BATCH, LOGICAL_CPUS).eval_batches():
        logits = many.predict(state, evaluation.batch)
        assert logits.shape == (GLOBAL_BATCH, spec.num_labels)
        real = evaluation.index >= 0
        np.testing.assert_array_equal(evaluation.batch["weight"] > 0, real)
        gathered[evaluation.index[real]] = logits[real]
        seen[evaluation.index[real]] += 1
    np.testing.assert_array_equal(seen, 1)
    np.testing.assert_allclose(gathered, unpadded, atol=1e-5)


def test_global_batch_not_divisible_by_replicas(backends, tiny_dir):
    _, many = backends
    state = many.init(model_spec(tiny_dir), OptimizerSpec())
    batch = next(Batcher(random_split(24, 8), 12, 1).train_batches(epoch=0))
    with pytest.raises(TpuplexError, match=r"train.global_batch = 12 does not divide by the 8 replicas"):
        many.train_step(state, batch, 1e-3)

"""Properties of the static-shape Batcher, for any dataset size, batch size, replica count and bucket set."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuplex.data.batching import Batcher, Encoded, bucket_lengths, check_divisible, fit_buckets
from tpuplex.errors import TpuplexError

MAX_LENGTH = 24


def encoded(lengths: list[int], regression: bool = False) -> Encoded:
    """A split whose row i holds tokens i*1000+1 ... (so rows are recognisable) with the given lengths."""
    lengths_array = np.asarray(lengths, np.int32)
    positions = np.arange(MAX_LENGTH)
    real = positions[None, :] < lengths_array[:, None]
    ids = (np.arange(len(lengths))[:, None] * 1000 + positions[None, :] + 1) * real
    labels = np.arange(len(lengths), dtype=np.float32 if regression else np.int32)
    return Encoded(ids.astype(np.int32), (positions[None, :] % 2 * real).astype(np.int32), lengths_array, labels)


splits = st.lists(st.integers(1, MAX_LENGTH), min_size=1, max_size=70)
replica_counts = st.sampled_from([1, 2, 3, 4, 8])
bucket_sets = st.lists(st.integers(1, MAX_LENGTH + 8), max_size=4)


@st.composite
def batchers(draw) -> Batcher:
    replicas = draw(replica_counts)
    global_batch = replicas * draw(st.integers(1, 4))
    return Batcher(encoded(draw(splits)), global_batch, replicas, draw(bucket_sets), seed=draw(st.integers(0, 9)),
                   group_by_length=draw(st.booleans()))


def row_of(batch_ids: np.ndarray) -> np.ndarray:
    """The split row each batch row came from (token id // 1000 of its first token)."""
    return (batch_ids[:, 0] - 1) // 1000


@settings(max_examples=80, deadline=None)
@given(batchers(), st.integers(0, 3))
def test_training_batches_are_static_and_exact(batcher: Batcher, epoch: int) -> None:
    allowed = set(batcher.lengths)
    batches = list(batcher.train_batches(epoch))
    assert len(batches) == batcher.steps_per_epoch
    seen, short_batches, mixed_batches = [], 0, 0
    for batch in batches:
        rows, length = batch["input_ids"].shape
        assert rows == batcher.global_batch and length in allowed
        assert all(batch[key].shape == (rows, length) for key in ("token_type_ids", "attention_mask"))
        assert batch["labels"].shape == batch["weight"].shape == (rows,)
        assert set(np.unique(batch["weight"])) <= {0.0, 1.0}
        source = row_of(batch["input_ids"])
        # Each row fits, the mask marks exactly its real tokens, and no smaller bucket would hold the batch.
        assert np.all(batcher.data.lengths[source] <= length)
        assert np.array_equal(batch["attention_mask"].sum(axis=1), batcher.data.lengths[source])
        assert np.array_equal(batch["labels"], batcher.data.labels[source])
        smaller = [b for b in allowed if b < length]
        assert not smaller or batcher.data.lengths[source].max() > max(smaller)
        real = batch["weight"] == 1
        seen.extend(source[real].tolist())
        short_batches += int(not real.all())
        mixed_batches += int(bool(smaller) and batcher.data.lengths[source].min() <= max(smaller))
    # Every example once per epoch; only one batch is short, and only when the examples do not divide.
    assert sorted(seen) == list(range(len(batcher.data)))
    assert short_batches == int(len(batcher.data) % batcher.global_batch != 0)
    if batcher.group_by_length:
        # Only the buckets' remainders (fewer than a batch each) share batches with other lengths.
        remainders = np.bincount(np.searchsorted(np.asarray(batcher.lengths), batcher.data.lengths)
                                 ) % batcher.global_batch
        assert mixed_batches <= -(-int(remainders.sum()) // batcher.global_batch)


@settings(max_examples=60, deadline=None)
@given(batchers())
def test_evaluation_counts_every_example_once(batcher: Batcher) -> None:
    counts = np.zeros(len(batcher.data), np.int64)
    for item in batcher.eval_batches():
        batch, index = item.batch, item.index
        rows, length = batch["input_ids"].shape
        assert rows == batcher.global_batch and length in batcher.lengths
        real = batch["weight"] == 1
        assert np.all((batch["weight"] == 0) == ~real)
        assert np.all(index[~real] == -1) and np.all(index[real] >= 0)
        assert np.array_equal(row_of(batch["input_ids"])[real], index[real])
        assert np.all(batch["attention_mask"].sum(axis=1) >= 1)  # padding rows are never all padding
        np.add.at(counts, index[real], 1)
    assert np.all(counts == 1)


@settings(max_examples=30, deadline=None)
@given(batchers(), st.integers(0, 5))
def test_order_depends_only_on_seed_and_epoch(batcher: Batcher, epoch: int) -> None:
    again = Batcher(batcher.data, batcher.global_batch, 1, batcher.lengths, seed=batcher.seed,
                    group_by_length=batcher.group_by_length)
    first = [row_of(b["input_ids"]).tolist() for b in batcher.train_batches(epoch)]
    assert first == [row_of(b["input_ids"]).tolist() for b in again.train_batches(epoch)]


@settings(max_examples=30, deadline=None)
@given(batchers(), st.integers(0, 5), st.data())
def test_resuming_at_a_position_continues_the_same_sequence(batcher: Batcher, epoch: int, data) -> None:
    whole = [row_of(b["input_ids"]).tolist() for b in batcher.train_batches(epoch)]
    start = data.draw(st.integers(0, len(whole)))
    assert [row_of(b["input_ids"]).tolist() for b in batcher.train_batches(epoch, start)] == whole[start:]


def test_different_epochs_and_seeds_give_different_orders() -> None:
    data = encoded([5 + i % 7 for i in range(64)])
    batcher = Batcher(data, 8, 2, (8,), seed=3)

    def order(b: Batcher, epoch: int) -> list[list[int]]:
        return [row_of(x["input_ids"]).tolist() for x in b.train_batches(epoch)]

    assert order(batcher, 0) != order(batcher, 1)
    assert order(batcher, 0) != order(Batcher(data, 8, 2, (8,), seed=4), 0)


@given(st.integers(1, 64), st.sampled_from([2, 3, 4, 8]))
def test_divisibility_error_lists_sizes_that_work(global_batch: int, replicas: int) -> None:
    if global_batch % replicas == 0:
        check_divisible(global_batch, replicas)
        return
    with pytest.raises(TpuplexError) as error:
        Batcher(encoded([3] * 10), global_batch, replicas)
    message = str(error.value)
    assert f"train.global_batch = {global_batch}" in message and f"{replicas} replicas" in message
    suggested = [int(n) for n in re.findall(r"\d+", message.split("such as", 1)[1])]
    assert suggested and all(n > 0 and n % replicas == 0 for n in suggested)


def test_bucket_lengths_always_include_max_length() -> None:
    assert bucket_lengths((), 128) == (128,)
    assert bucket_lengths((64, 32, 64, 200, 0), 128) == (32, 64, 128)


def test_an_empty_split_is_refused() -> None:
    empty = Encoded(np.zeros((0, 4), np.int32), np.zeros((0, 4), np.int32), np.zeros(0, np.int32),
                    np.zeros(0, np.int32))
    with pytest.raises(TpuplexError, match="empty"):
        Batcher(empty, 4, 1)


def test_padding_efficiency_is_real_over_padded_tokens() -> None:
    data = encoded([4, 4, 8, 8])
    # 24 real tokens: padded to max_length in one bucket, or exactly filling buckets of 4 and 8.
    assert Batcher(data, 2, 1, ()).padding_efficiency(train=False) == pytest.approx(24 / (4 * MAX_LENGTH))
    assert Batcher(data, 2, 1, (4, 8)).padding_efficiency(train=False) == pytest.approx(1.0)


def padded_slots(lengths: np.ndarray, buckets: tuple[int, ...]) -> int:
    allowed = np.asarray(buckets)
    return int(allowed[np.searchsorted(allowed, lengths)].sum())


@settings(max_examples=150, deadline=None)
@given(max_length=st.sampled_from([8, 20, 32, 45, 64]), count=st.integers(1, 4), multiple=st.sampled_from([1, 4, 8]),
       fractions=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60))
def test_fitted_buckets_are_the_best_choice_of_at_most_count_lengths(max_length, count, multiple, fractions) -> None:
    lengths = np.array([max(1, int(np.ceil(f * max_length))) for f in fractions])
    fitted = fit_buckets(lengths, max_length, count, multiple)
    rounded = {min(-(-int(n) // multiple) * multiple, max_length) for n in lengths}
    assert fitted[-1] == max(rounded) and len(fitted) <= count and list(fitted) == sorted(set(fitted))
    assert all(length % multiple == 0 or length == max_length for length in fitted)
    best = min(padded_slots(lengths, (*chosen, max(rounded))) for size in range(count)
               for chosen in itertools.combinations(sorted(rounded - {max(rounded)}), size))
    assert padded_slots(lengths, fitted) == best


def test_equal_lengths_get_one_bucket() -> None:
    assert fit_buckets(np.full(10, 13), 128, 8) == (13,)
    assert fit_buckets(np.full(10, 13), 128, 8, multiple=8) == (16,)

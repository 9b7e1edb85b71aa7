"""Batches prepared ahead in a background thread: the same items in the same order, errors where they happened,
and the time the consumer waited."""

from __future__ import annotations

import threading
import time

import pytest

from tpuplex.engine.prefetch import Prefetcher


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_items_come_in_order_and_an_error_where_it_happened(depth) -> None:
    def items():
        yield from range(5)
        raise ValueError("shard 5 is damaged")

    prefetcher = Prefetcher(items(), depth)
    assert [next(prefetcher) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="shard 5 is damaged"):
        next(prefetcher)


def test_the_consumer_waits_only_for_what_is_not_ready() -> None:
    def slow():
        for item in range(3):
            time.sleep(0.3)
            yield item

    prefetcher = Prefetcher(slow(), depth=2)
    assert list(prefetcher) == [0, 1, 2]
    assert prefetcher.waited >= 0.5  # ~0.9 s: each item 0.3 s after the last, none ready when asked for
    queued = threading.Event()

    def ready():
        yield from range(3)
        queued.set()  # every item is in the queue

    prefetched = Prefetcher(ready(), depth=4)
    assert queued.wait(timeout=60)
    assert list(prefetched) == [0, 1, 2] and prefetched.waited < 0.25  # queue reads only, no producing


def test_close_stops_the_thread_early() -> None:
    produced = []

    def endless():
        count = 0
        while True:
            produced.append(count)
            yield count
            count += 1

    before = threading.active_count()
    prefetcher = Prefetcher(endless(), depth=2)
    assert next(prefetcher) == 0
    prefetcher.close()
    deadline = time.time() + 2
    while threading.active_count() > before and time.time() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before and len(produced) <= 5


def test_a_run_trains_the_same_numbers_whatever_the_prefetch_depth(write_config, tmp_path) -> None:
    from tpuplex import config as config_lib
    from tpuplex.commands import run

    losses = {}
    for depth in (0, 3):
        config = config_lib.load(write_config(), [f"runtime.prefetch={depth}", "train.epochs=2",
                                                  f'runtime.output_dir="{tmp_path / str(depth)}"'])
        losses[depth] = run.train(config, "numpy")["losses"]
    assert losses[0] == losses[3] and losses[0]["steps"] > 2

"""Host batches prepared ahead of the device step in a background thread, and the time the step waited for them.

Reading an image batch's rows from the shards' pages, gathering them and drawing its crops and flips is numpy work
that releases the GIL, as do the frameworks while a step runs, so one thread `depth` batches ahead keeps the input
off the step's critical path. The batches and their order are exactly those of the iterator it wraps.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

_END = object()


class Prefetcher:
    """Iterates `items` in a daemon thread, at most `depth` items ahead (`depth` 0: in the caller's thread).

    waited: seconds `__next__` has spent waiting for an item that was not ready yet. An exception raised by
    `items` is raised again by `__next__` at the position it occurred. `close` stops the thread early.
    """

    def __init__(self, items: Iterator[Any], depth: int):
        self.waited = 0.0
        self._items = items
        self._queue: queue.Queue | None = None
        if depth > 0:
            self._queue = queue.Queue(maxsize=depth)
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._fill, name="tpuplex-prefetch", daemon=True)
            self._thread.start()

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        started = time.perf_counter()
        if self._queue is None:
            item = next(self._items, _END)
        else:
            item = self._queue.get()
        self.waited += time.perf_counter() - started
        if isinstance(item, _Raised):
            raise item.error
        if item is _END:
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop producing (the thread ends at its next item); safe to call more than once."""
        if self._queue is not None:
            self._stop.set()
            while not self._queue.empty():
                self._queue.get_nowait()

    def _fill(self) -> None:
        try:
            for item in self._items:
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as error:  # noqa: BLE001 (handed to the consumer, who raises it)
            self._put(_Raised(error))

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


class _Raised:
    def __init__(self, error: BaseException):
        self.error = error

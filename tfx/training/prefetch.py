"""The next update's batches, collated (and pinned) in a background thread while the device runs this one.

On a GPU the host otherwise builds each batch (numpy padding or packing, the page-locked copy) between
two updates while the device waits. One worker thread is enough: collating is numpy work that
releases the GIL in its copies, and only the very next batch is ever prepared. On CPU there is no
device to overlap with, so the trainer builds batches inline (``enabled=False``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """``prepare(key, make)`` starts ``make()`` in the background; ``get(key, make)`` returns its result,
    or runs ``make()`` itself when nothing (or something else) was prepared."""

    def __init__(self, enabled: bool) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tfx-batches") if enabled else None
        self._key: Hashable | None = None
        self._future: Future[T] | None = None

    def prepare(self, key: Hashable, make: Callable[[], T]) -> None:
        if self._pool is not None:
            self._key, self._future = key, self._pool.submit(make)

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        future, self._future = self._future, None
        if future is not None and self._key == key:
            return future.result()
        if future is not None:
            future.cancel()
        return make()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

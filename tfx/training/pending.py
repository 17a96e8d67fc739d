"""The updates queued on the device and not read yet: the loop reads them all with one host sync.

``tfx.training.step`` leaves each update's results on the device (``Pending``); reading one waits for every
kernel before it, so the loop queues updates and reads the queue only when something needs the
numbers (``tfx.training.schedule``) or the queue holds ``capacity`` updates.
"""

from __future__ import annotations

import time

from tfx.checkpoints.train_state import TrainState
from tfx.training.step import Pending, read


class PendingUpdates:
    """Queued updates, counted as applied until read (they are, unless non-finite or an fp16 overflow)."""

    def __init__(self, state: TrainState, capacity: int) -> None:
        self.state = state  # the run's counters: ``step`` counts the read updates, ``train_seconds`` the waits
        self.capacity = max(capacity, 1)  # read at least this often (the log interval), or the queue would grow
        self._queue: list[Pending] = []

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def step(self) -> int:
        """The update count once every queued update is applied: what the lr and the schedule assume."""
        return self.state.step + len(self._queue)

    @property
    def full(self) -> bool:
        return len(self._queue) >= self.capacity

    def push(self, pending: Pending) -> None:
        self._queue.append(pending)

    def read(self) -> list[dict[str, float]]:
        """Every queued update's numbers, oldest first, and an empty queue; the wait is training time."""
        if not self._queue:
            return []
        tic, (queued, self._queue) = time.perf_counter(), (self._queue, [])
        raw = read(queued)
        self.state.train_seconds += time.perf_counter() - tic  # the wait for the device is training time
        return raw

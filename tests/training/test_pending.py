"""``PendingUpdates``: queued updates count as applied until read; one read takes them all, oldest first."""

from __future__ import annotations

import torch

from tfx.checkpoints.train_state import TrainState
from tfx.training.pending import PendingUpdates
from tfx.training.step import Pending


def pending(loss: float) -> Pending:
    return Pending({"loss": torch.tensor(loss)}, {"train/lr": 0.1})


def test_the_queue_counts_its_updates_as_applied_and_reads_them_in_order() -> None:
    state = TrainState(step=7)
    queue = PendingUpdates(state, capacity=2)
    assert (queue.step, len(queue), queue.full, queue.read()) == (7, 0, False, [])
    assert state.train_seconds == 0.0  # an empty read waits for nothing
    queue.push(pending(1.0))
    assert (queue.step, queue.full) == (8, False)
    queue.push(pending(2.0))
    assert (queue.step, queue.full) == (9, True)
    assert queue.read() == [{"train/lr": 0.1, "loss": 1.0}, {"train/lr": 0.1, "loss": 2.0}]
    assert (len(queue), queue.step, state.step) == (
        0,
        7,
        7,
    )  # counting them is the caller's (tfx.training.step.account)
    assert state.train_seconds > 0.0  # the wait for the device is training time

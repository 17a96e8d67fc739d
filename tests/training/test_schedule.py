"""``Schedule.due``: each concern's own interval, and one answer the queue's reads and the actions share."""

from __future__ import annotations

from tfx.checkpoints.train_state import TrainState
from tfx.config import TrainConfig
from tfx.training.schedule import NEVER, Action, BudgetSpent, Every, Until, loop_schedule


def due_steps(periodic: Every | Until | BudgetSpent | Action, last: int = 12) -> list[int]:
    return [s for s in range(1, last + 1) if periodic.due(s)]


def test_every_n_updates_from_its_phase_and_never_at_zero() -> None:
    assert due_steps(Every(4)) == [4, 8, 12]
    assert due_steps(Every(4, offset=1)) == [1, 5, 9]  # the layer statistics: the first update, then every 4th
    assert due_steps(Every(1, offset=1)) == list(range(1, 13))
    assert due_steps(NEVER) == []


def test_until_covers_the_first_updates_and_the_budget_counts_the_assumed_step() -> None:
    assert due_steps(Until(3)) == [1, 2, 3]
    state = TrainState(step=2, epoch=1)
    assert due_steps(BudgetSpent(state, TrainConfig(max_updates=5))) == list(range(5, 13))
    state.epoch = 3  # the live state's other counters decide too
    assert due_steps(BudgetSpent(state, TrainConfig(max_epochs=2))) == list(range(1, 13))


def test_the_loop_schedule_reads_each_interval_from_its_config_key() -> None:
    t = TrainConfig(log_every_updates=5, layer_stats_every_updates=4, probe_updates=2)
    action = Action(Every(6), lambda trainer: None)
    schedule = loop_schedule(t, TrainState(), validate=Every(3), save=Every(10), probing=True, hooked=False,
                             actions=[action])  # fmt: skip
    dues = {s: schedule.due(s) for s in range(1, 13)}
    assert [s for s, d in dues.items() if d.log] == [5, 10]
    assert [s for s, d in dues.items() if d.layers] == [1, 5, 9]
    assert [s for s, d in dues.items() if d.probe] == [1, 2]
    assert [s for s, d in dues.items() if d.validate] == [3, 6, 9, 12]
    assert [s for s, d in dues.items() if d.save] == [10]
    assert [s for s, d in dues.items() if d.actions] == [6, 12] and dues[6].actions == (action,)
    assert not any(d.hook or d.stop for d in dues.values())
    assert [s for s, d in dues.items() if not d.read] == [4, 7, 8, 11]  # nothing acts there: the queue stays


def test_a_hook_makes_every_update_due() -> None:
    schedule = loop_schedule(TrainConfig(), TrainState(), validate=NEVER, save=NEVER, probing=False, hooked=True)
    assert all(schedule.due(s).hook and schedule.due(s).read for s in range(1, 50))

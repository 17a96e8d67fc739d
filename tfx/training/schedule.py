"""What is due at an update: one ``Schedule.due(step)`` that the queue's reads and the loop's actions both ask.

Each periodic concern owns its schedule (torchtitan's ``should_save``/``should_validate`` style): the
validator its intervals, the checkpointer its numbered saves, the budget its limits. The loop reads the
queue of pending updates whenever ``due(step).read`` says any of them acts at ``step``, so a concern
cannot be forgotten in one place and remembered in the other. ``step`` is the update count once that
update is applied (1 for the first update).

A new periodic action is one object with ``due(step)`` and ``run(trainer)`` (e.g. ``Action(Every(500),
fn)``) passed to ``Trainer``/``train`` in ``actions``: it runs after the queue is read, at exactly the
updates it names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tfx.checkpoints.train_state import TrainState
from tfx.config import TrainConfig


class Periodic(Protocol):
    """A concern that acts at some updates. ``due`` must be pure: the loop asks it several times per update."""

    def due(self, step: int) -> bool: ...


class PeriodicAction(Periodic, Protocol):
    """A periodic concern the loop runs itself, after reading the queue, at each update ``due`` names."""

    def run(self, trainer: Any) -> None: ...  # the Trainer (not imported: it imports this module)


@dataclass(frozen=True)
class Every:
    """Due at every ``n``-th update (0 = never); ``offset`` shifts the phase (1: the first update, n + 1, ...)."""

    n: int
    offset: int = 0

    def due(self, step: int) -> bool:
        return self.n > 0 and step % self.n == self.offset % self.n


NEVER = Every(0)


@dataclass(frozen=True)
class Until:
    """Due at every update up to and including ``last`` (the output-change probe's first updates)."""

    last: int

    def due(self, step: int) -> bool:
        return step <= self.last


@dataclass(frozen=True)
class BudgetSpent:
    """Due once ``step`` updates would leave no budget (updates, epochs, minutes, patience) with ``state``'s
    other counters: the loop then stops."""

    state: TrainState  # the run's own counters, read live (epoch, train time, stale validations)
    t: TrainConfig

    def due(self, step: int) -> bool:
        return not dataclasses.replace(self.state, step=step).budget_left(self.t)


@dataclass(frozen=True)
class Action:
    """A periodic action from a schedule and a function of the trainer: ``Action(Every(100), fn)``."""

    when: Periodic
    fn: Callable[[Any], None]

    def due(self, step: int) -> bool:
        return self.when.due(step)

    def run(self, trainer: Any) -> None:
        self.fn(trainer)


@dataclass(frozen=True)
class Due:
    """What update ``step`` calls for; any of it means the queue must be read first (``read``)."""

    log: bool  # TensorBoard scalars and the progress line (tfx.reporting.reporter)
    layers: bool  # this update records per-layer statistics (it runs eagerly)
    probe: bool  # the output-change probe measures after this update
    hook: bool  # the on_update hook sees this update
    validate: bool
    save: bool  # a numbered checkpoint
    stop: bool  # the budget is spent
    actions: tuple[PeriodicAction, ...] = ()

    @property
    def read(self) -> bool:
        flags = (self.log, self.layers, self.probe, self.hook, self.validate, self.save, self.stop)
        return any(flags) or bool(self.actions)


@dataclass
class Schedule:
    """Every periodic concern of the loop, each with its own schedule; ``due(step)`` asks them all."""

    log: Periodic
    layers: Periodic
    probe: Periodic
    hook: Periodic
    validate: Periodic
    save: Periodic
    stop: Periodic
    actions: list[PeriodicAction] = field(default_factory=list)

    def due(self, step: int) -> Due:
        ready = tuple(a for a in self.actions if a.due(step))
        return Due(self.log.due(step), self.layers.due(step), self.probe.due(step), self.hook.due(step),
                   self.validate.due(step), self.save.due(step), self.stop.due(step), ready)  # fmt: skip


def loop_schedule(
    t: TrainConfig, state: TrainState, validate: Periodic, save: Periodic, probing: bool, hooked: bool,
    actions: Sequence[PeriodicAction] = (),
) -> Schedule:  # fmt: skip
    """The trainer's schedule from ``train.*``: the intervals here, validation's and saving's from their owners."""
    return Schedule(
        log=Every(t.log_every_updates),
        layers=Every(t.layer_stats_every_updates, offset=1),  # the first update, then every n-th after it
        probe=Until(t.probe_updates) if probing else NEVER,
        hook=Every(1) if hooked else NEVER,  # a hook sees every update, so every update is read
        validate=validate,
        save=save,
        stop=BudgetSpent(state, t),
        actions=list(actions),
    )

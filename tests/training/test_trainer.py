"""The trainer's loop on CPU: a periodic action registered in one place runs at its interval, and only then;
the stepper is built once per run."""

from __future__ import annotations

from pathlib import Path

import pytest

import tfx.training.pending as pending_mod
from tests.test_train import tiny_cfg
from tfx.train import Trainer, train
from tfx.training.schedule import Action, Every
from tfx.training.step import Stepper


def test_a_registered_action_runs_at_its_interval_and_only_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logging every 50 updates and nothing else due: only the action's own schedule makes the loop read the
    queue at updates 3, 6 and 9, and the action then sees those exact, counted updates."""
    reads: list[int] = []
    real_read = pending_mod.read
    monkeypatch.setattr(pending_mod, "read", lambda queued: reads.append(len(queued)) or real_read(queued))
    seen: list[tuple[int, int]] = []
    action = Action(Every(3), lambda trainer: seen.append((trainer.state.step, len(trainer.queue))))
    quiet = {"log_every_updates": 50, "layer_stats_every_updates": 0, "max_updates": 10, "save_every_epochs": 0}
    train(tiny_cfg(tmp_path, **quiet), tmp_path / "run", actions=[action])
    assert seen == [(3, 0), (6, 0), (9, 0)]
    assert reads[:3] == [3, 3, 3]  # read when the action is due, not every update


def test_the_stepper_is_built_once_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Stepper] = []
    real_init = Stepper.__init__
    monkeypatch.setattr(Stepper, "__init__", lambda self, *a, **kw: built.append(self) or real_init(self, *a, **kw))
    trainer = Trainer(tiny_cfg(tmp_path, max_updates=5), tmp_path / "run")
    try:
        assert trainer.run()["step"] == 5
    finally:
        trainer.close()
    assert built == [trainer.stepper]

"""tfx/checkpoints/numbered.py: numbered checkpoints sort by step (then epoch), not by name; the window an average
chooses from (a final checkpoint's near duplicate left out); "the last N" and what it says (docs/evaluation.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checkpoint_helpers import tiny_config, write_checkpoint
from tfx.checkpoints.numbered import last_checkpoints, numbered_checkpoints, save_interval, window_checkpoints


def test_numbered_checkpoints_order_by_step_then_epoch(tmp_path: Path) -> None:
    for name in ("checkpoint_10_500.pt", "checkpoint_9_500.pt", "checkpoint_2_40.pt", "checkpoint_last.pt", "x.pt"):
        (tmp_path / name).touch()
    found = [p.name for p in numbered_checkpoints(tmp_path)]
    assert found == ["checkpoint_2_40.pt", "checkpoint_9_500.pt", "checkpoint_10_500.pt"]


def test_last_n_may_take_every_numbered_checkpoint(tmp_path: Path) -> None:
    for epoch in (1, 2, 3):
        write_checkpoint(tmp_path / f"checkpoint_{epoch}_{10 * epoch}.pt", step=10 * epoch)
    assert [p.name for p in last_checkpoints(tmp_path, 3)] == [f"checkpoint_{e}_{10 * e}.pt" for e in (1, 2, 3)]


def test_a_run_that_has_not_saved_yet_has_no_numbered_checkpoints(tmp_path: Path) -> None:
    """An absent checkpoints/ folder is an empty list, not FileNotFoundError (the converged study asks for every
    finalist's window, started or not; no computation)."""
    assert numbered_checkpoints(tmp_path / "run" / "checkpoints") == []


def toy_like_run(tmp_path: Path, final: tuple[int, int], config: dict | None = None) -> Path:
    """The toy run's checkpoint folder (issue 67): epochs of 148 updates, keep_last 5, ``max_updates`` stopping the
    run in epoch 9 (``final``: the label and update of its final checkpoint)."""
    folder = tmp_path / "run" / "checkpoints"
    for epoch in (5, 6, 7, 8):
        write_checkpoint(folder / f"checkpoint_{epoch}_{148 * epoch}.pt", seed=epoch, step=148 * epoch, config=config)
    epoch, step = final
    write_checkpoint(folder / f"checkpoint_{epoch}_{step}.pt", seed=9, step=step, config=config)
    return tmp_path / "run"


def test_a_final_checkpoint_just_after_an_epoch_end_stands_in_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """checkpoint_9_1200.pt, 16 updates after checkpoint_8_1184.pt: nearly the same weights, counted once (the later
    ones); the window has 4, so --avg 5 averages 4 and says why in two grammatical lines."""
    run = toy_like_run(tmp_path, (9, 1200))
    folder = run / "checkpoints"
    window = ["checkpoint_5_740.pt", "checkpoint_6_888.pt", "checkpoint_7_1036.pt", "checkpoint_9_1200.pt"]
    assert [p.name for p in window_checkpoints(folder)] == window
    assert save_interval(numbered_checkpoints(folder)) == 148
    assert [p.name for p in last_checkpoints(run, 5)] == window
    assert capsys.readouterr().err == (
        f"{folder}: leaving out checkpoint_8_1184.pt: the newest, checkpoint_9_1200.pt, is 16 updates later, less "
        "than half the 148 between saves (nearly the same weights)\n"
        f"{folder} has 4 checkpoints to average, not 5: averaging those 4\n"
    )
    assert [p.name for p in last_checkpoints(run, 2)] == window[-2:]
    assert "leaving out checkpoint_8_1184.pt" in capsys.readouterr().err
    assert [p.name for p in last_checkpoints(run, 1)] == window[-1:] and capsys.readouterr().err == ""


def test_a_final_checkpoint_half_an_interval_on_counts_on_its_own(tmp_path: Path) -> None:
    """74 updates (half of a 148-update epoch) after the last epoch end: a checkpoint of its own."""
    run = toy_like_run(tmp_path, (9, 1184 + 74))
    window = [p.name for p in window_checkpoints(run / "checkpoints")]
    assert window[-2:] == ["checkpoint_8_1184.pt", "checkpoint_9_1258.pt"]


def test_the_interval_is_save_every_updates_when_saves_are_by_updates(tmp_path: Path) -> None:
    """train.save_every_updates=100 in epochs of 1000 updates: a final checkpoint 10 updates after a save is its near
    duplicate (an epoch is no measure here: the names give 300 updates per epoch at most)."""
    config = tiny_config()
    config["train"].update(save_every_updates=100, save_every_epochs=0)
    folder = tmp_path / "run" / "checkpoints"
    for step in (100, 200, 300, 310):
        write_checkpoint(folder / f"checkpoint_1_{step}.pt", seed=step, step=step, config=config)
    assert save_interval(numbered_checkpoints(folder)) == 100
    assert [p.name for p in window_checkpoints(folder)] == [f"checkpoint_1_{s}.pt" for s in (100, 200, 310)]


def test_one_checkpoint_to_average_is_said_in_the_singular(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A run stopped 12 updates into its second epoch: its final checkpoint stands in for epoch 1's, and one
    checkpoint is used as it is (no "1 numbered checkpoint(s) ... averaging those 1")."""
    folder = tmp_path / "run" / "checkpoints"
    write_checkpoint(folder / "checkpoint_1_148.pt", step=148)
    write_checkpoint(folder / "checkpoint_2_160.pt", seed=1, step=160)
    assert [p.name for p in last_checkpoints(tmp_path / "run", 5)] == ["checkpoint_2_160.pt"]
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"{folder} has 1 checkpoint to average, not 5: using checkpoint_2_160.pt as it is"
    assert len(err) == 2 and "(s)" not in "".join(err)


def test_unreadable_or_unscheduled_checkpoints_leave_nothing_out(tmp_path: Path) -> None:
    """No config to read the interval from (an empty file), or no numbered saves configured: every numbered
    checkpoint is a candidate, as before."""
    for name in ("checkpoint_1_148.pt", "checkpoint_2_150.pt"):
        (tmp_path / name).touch()
    assert len(window_checkpoints(tmp_path)) == 2
    config = tiny_config()
    config["train"].update(save_every_updates=0, save_every_epochs=0)
    for name, step in (("checkpoint_1_148.pt", 148), ("checkpoint_2_150.pt", 150)):
        write_checkpoint(tmp_path / name, step=step, config=config)
    assert save_interval(numbered_checkpoints(tmp_path)) is None and len(window_checkpoints(tmp_path)) == 2

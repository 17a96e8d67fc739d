"""tfx/checkpoints/numbered.py: numbered checkpoints sort by step (then epoch), not by name; "the last N"."""

from __future__ import annotations

from pathlib import Path

from tests.checkpoint_helpers import write_checkpoint
from tfx.checkpoints.numbered import last_checkpoints, numbered_checkpoints


def test_numbered_checkpoints_order_by_step_then_epoch(tmp_path: Path) -> None:
    for name in ("checkpoint_10_500.pt", "checkpoint_9_500.pt", "checkpoint_2_40.pt", "checkpoint_last.pt", "x.pt"):
        (tmp_path / name).touch()
    found = [p.name for p in numbered_checkpoints(tmp_path)]
    assert found == ["checkpoint_2_40.pt", "checkpoint_9_500.pt", "checkpoint_10_500.pt"]


def test_last_n_may_take_every_numbered_checkpoint(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        write_checkpoint(tmp_path / f"checkpoint_1_{step}.pt", step=step)
    assert [p.name for p in last_checkpoints(tmp_path, 3)] == [f"checkpoint_1_{s}.pt" for s in (10, 20, 30)]


def test_a_run_that_has_not_saved_yet_has_no_numbered_checkpoints(tmp_path: Path) -> None:
    """An absent checkpoints/ folder is an empty list, not FileNotFoundError (the converged study asks for every
    finalist's window, started or not; no computation)."""
    assert numbered_checkpoints(tmp_path / "run" / "checkpoints") == []

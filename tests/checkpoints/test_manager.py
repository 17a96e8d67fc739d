"""CheckpointManager's pruning of numbered checkpoints (CPU, no model: the payloads are small dicts)."""

from __future__ import annotations

from pathlib import Path

import torch

from tfx.checkpoints.manager import CheckpointManager


def test_pruning_keeps_the_newest_numbered_and_leaves_other_files_of_that_shape_alone(tmp_path: Path) -> None:
    """A user's file named like ``checkpoint_<x>_<y>.pt`` (an average written mid-run beside the checkpoints, a
    best model copied aside) is not a numbered checkpoint: the epoch end neither fails on it nor deletes it."""
    manager = CheckpointManager(tmp_path / "run", keep_last=2)
    manager.open()
    users = [manager.dir / "checkpoint_avg_last5.pt", manager.dir / "checkpoint_best_epoch3.pt"]
    for path in users:
        torch.save({"step": 0}, path)
    try:
        for epoch, step in [(1, 10), (2, 20), (3, 30)]:
            manager.save({"step": step, "epoch": epoch}, write_last=True, best=False, numbered_epoch=epoch)
    finally:
        manager.close()
    numbered = sorted(p.name for p in manager.dir.glob("checkpoint_*_*.pt") if p not in users)
    assert numbered == ["checkpoint_2_20.pt", "checkpoint_3_30.pt"]
    assert all(path.is_file() for path in users)

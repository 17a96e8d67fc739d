"""Atomic writes (tfx/files/atomic.py): a failure leaves the old file and no temp file; files follow the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from tfx.checkpoints.load import load_checkpoint
from tfx.files.atomic import atomic_copy, atomic_open, atomic_save


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_failed_save_keeps_the_previous_checkpoint_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint_last.pt"
    atomic_save({"model": {"w": torch.ones(3)}, "config": {}}, path)
    with pytest.raises(RuntimeError, match="cannot pickle"):
        atomic_save({"model": {"w": torch.zeros(3)}, "config": {}, "bad": Unpicklable()}, path)
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint_last.pt"]


def test_written_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        atomic_save({"model": {}, "config": {}}, tmp_path / "a.pt")
        atomic_copy(tmp_path / "a.pt", tmp_path / "b.pt")
        with atomic_open(tmp_path / "c.txt", "w", encoding="utf-8") as f:
            f.write("x\n")
    finally:
        os.umask(old)
    for name in ("a.pt", "b.pt", "c.txt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o640, name  # not mkstemp's 0o600
    assert (tmp_path / "b.pt").read_bytes() == (tmp_path / "a.pt").read_bytes()
    assert (tmp_path / "c.txt").read_text(encoding="utf-8") == "x\n"

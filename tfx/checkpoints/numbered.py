"""The numbered checkpoints of a run folder, oldest first, and "the last N" of them.

``tfx.train`` writes ``checkpoint_<epoch>_<step>.pt`` (at epoch ends, and of the final state when a run stops);
``tfx.average`` (``--last``, ``--best-window``)
and ``tfx.evaluate`` (``--avg``) read them. One module below both, so neither imports the other for it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tfx.checkpoints.load import CheckpointError
from tfx.checkpoints.transaction import settle

NUMBERED = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")  # checkpoint_<epoch>_<step>.pt, written by tfx.train


def checkpoint_dir(run_dir: str | Path) -> Path:
    """``RUN/checkpoints`` when it exists (a run folder), else the folder itself; a save that a killed trainer
    had committed is finished first (``transaction.settle``), so a reader sees one save's files, whole."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"run folder {run_dir} does not exist")
    sub = run_dir / "checkpoints"
    folder = sub if sub.is_dir() else run_dir
    settle(folder)
    return folder


def numbered_checkpoints(folder: str | Path) -> list[Path]:
    """``checkpoint_<epoch>_<step>.pt`` files in ``folder``, oldest (lowest step) first; none when ``folder`` is
    absent (a run that has not saved yet)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m[2]), int(m[1]), p) for p in folder.iterdir() if (m := NUMBERED.match(p.name))]
    return [p for _, _, p in sorted(found)]


def last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The ``n`` numbered checkpoints with the highest step ("the last N"), or all there are when fewer, with
    one line on stderr saying so (a short run has few epochs; its final state is numbered too, ``tfx.train``)."""
    if n < 1:
        raise CheckpointError(f"--avg/--last {n}: need at least 1 checkpoint")
    folder = checkpoint_dir(run_dir)
    paths = numbered_checkpoints(folder)
    if not paths:
        raise CheckpointError(
            f"{folder} has no numbered checkpoints (checkpoint_<epoch>_<step>.pt) to average: "
            "evaluate checkpoint_best.pt (leave out --avg)"
        )
    if len(paths) < n:
        have = len(paths)
        print(f"{folder} has {have} numbered checkpoint(s), not {n}: averaging those {have}", file=sys.stderr)
    return paths[-n:]

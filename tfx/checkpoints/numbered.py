"""The numbered checkpoints of a run folder, oldest first; the ones an average chooses from; "the last N" of them.

``tfx.train`` writes ``checkpoint_<epoch>_<step>.pt`` (at epoch ends, every ``train.save_every_updates``, and of the
final state when a run stops between those); ``tfx.average`` (``--last``, ``--best-window``) and ``tfx.evaluate``
(``--avg``, so ``scripts/eval_bleu.sh``) read them through ``window_checkpoints``: one rule for all three, in one
module below both, so neither imports the other for it (docs/evaluation.md, "Averaging").
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from tfx.checkpoints.load import CheckpointError, load_checkpoint
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


def best_checkpoint(target: str | Path, otherwise: str = "pass a checkpoint file") -> Path:
    """A checkpoint file as it is; a run folder (or its ``checkpoints/``): its ``checkpoint_best.pt``. What
    ``tfx.evaluate RUN`` and ``tfx.translate RUN`` read; ``otherwise`` ends the refusal of a folder without one."""
    target = Path(target)
    if target.is_file():
        return target
    if not target.is_dir():
        raise CheckpointError(f"{target} does not exist: pass a checkpoint file or a run folder")
    folder = checkpoint_dir(target)
    best = folder / "checkpoint_best.pt"
    if not best.is_file():
        raise CheckpointError(f"{folder} has no checkpoint_best.pt: {otherwise}")
    return best


def numbered_checkpoints(folder: str | Path) -> list[Path]:
    """``checkpoint_<epoch>_<step>.pt`` files in ``folder``, oldest (lowest step) first; none when ``folder`` is
    absent (a run that has not saved yet)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m[2]), int(m[1]), p) for p in folder.iterdir() if (m := NUMBERED.match(p.name))]
    return [p for _, _, p in sorted(found)]


def save_interval(paths: Sequence[Path]) -> float | None:
    """Updates between a run's scheduled numbered saves, from the newest checkpoint's config: ``save_every_updates``;
    or ``save_every_epochs`` epochs, an epoch being the most updates per epoch among the names (an epoch-end
    checkpoint's step over its epoch; a mid-epoch one's is lower); the smaller when both are on. None when neither is
    on or the checkpoint cannot be read (nothing is left out then; averaging reports an unreadable file itself)."""
    try:  # mmap: the config is read, the tensors stay in the file
        train = load_checkpoint(paths[-1], mmap=True)["config"].get("train", {})
    except CheckpointError:
        return None
    every_updates, every_epochs = train.get("save_every_updates") or 0, train.get("save_every_epochs") or 0
    per_epoch = max((step / epoch for epoch, step in map(_label, paths) if epoch > 0), default=0.0)
    found = [n for n in (every_updates, every_epochs * per_epoch) if n > 0]
    return min(found) if found else None


def window_checkpoints(folder: str | Path) -> list[Path]:
    """What ``--avg N``, ``--last N`` and ``--best-window K`` choose from, oldest first: the numbered checkpoints,
    less those that the newest one nearly duplicates. A run stopped between scheduled saves (a budget, patience,
    a signal) numbers its final state too, often a few updates after the last scheduled save (the toy run's
    ``checkpoint_9_1200.pt``, 16 updates after ``checkpoint_8_1184.pt``); a checkpoint less than half a save
    interval (``save_interval``) before the newest is left out, the newest, later weights standing in for it, so
    that an average does not count nearly the same weights twice."""
    return _window(numbered_checkpoints(folder))[0]


def _window(paths: list[Path]) -> tuple[list[Path], float | None]:
    """(``window_checkpoints`` of the numbered ``paths``, the save interval it used)."""
    if len(paths) < 2 or not (interval := save_interval(paths)):
        return paths, None
    newest = _label(paths[-1])[1]
    return [p for p in paths[:-1] if newest - _label(p)[1] >= interval / 2] + [paths[-1]], interval


def last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The last ``n`` of ``window_checkpoints``, or all there are when fewer; one line on stderr for each thing a
    reader would not expect: a checkpoint left out as a near duplicate of the newest, fewer than ``n`` to average."""
    if n < 1:
        raise CheckpointError(f"--avg/--last {n}: need at least 1 checkpoint")
    folder = checkpoint_dir(run_dir)
    numbered = numbered_checkpoints(folder)
    if not numbered:
        raise CheckpointError(
            f"{folder} has no numbered checkpoints (checkpoint_<epoch>_<step>.pt) to average: "
            "evaluate checkpoint_best.pt (leave out --avg)"
        )
    window, interval = _window(numbered)
    newest = window[-1]
    if n > 1 and (left_out := [p for p in numbered if p not in window]):
        gaps = _and([str(_label(newest)[1] - _label(p)[1]) for p in left_out])
        print(
            f"{folder}: leaving out {_and([p.name for p in left_out])}: the newest, {newest.name}, is {gaps} "
            f"updates later, less than half the {interval:.0f} between saves (nearly the same weights)",
            file=sys.stderr,
        )
    if len(window) < n:
        have = len(window)
        using = f"using {newest.name} as it is" if have == 1 else f"averaging those {have}"
        print(f"{folder} has {count(have, 'checkpoint')} to average, not {n}: {using}", file=sys.stderr)
    return window[-n:]


def count(n: int, noun: str) -> str:
    """``1 checkpoint``, ``3 checkpoints``: messages say what they count, in the singular when it is one."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _label(path: Path) -> tuple[int, int]:
    """(epoch, step) of a numbered checkpoint's name."""
    m = NUMBERED.match(path.name)
    return int(m[1]), int(m[2])


def _and(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"

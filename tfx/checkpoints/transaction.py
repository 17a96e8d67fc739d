"""A save of several checkpoint files as one transaction: after any kill, the folder holds the files of the save
before or of the save after, never a mix (no best named and absent, no numbered file missing for good).

A save writes ``checkpoint_last.pt``, maybe ``checkpoint_best.pt`` and a numbered checkpoint, and removes
superseded numbered ones. Each file alone is atomic (``tfx.files.atomic``), but a kill between two of them
left a ``checkpoint_last.pt`` whose state had moved past a missing best or numbered copy, and the resumed run
skipped the update that would have written them. Here a save is a write-ahead journal:

1. ``stage``: every new file is written in full to a hidden temp file beside its name (the slow part: GBs);
2. ``commit``: the journal ``.save.json`` is written atomically: which temp becomes which name, which files go;
3. the renames and removals are done (microseconds), then the journal is removed.

A kill before 2 leaves the previous save's files and hidden temps (removed at the next start); a kill after 2
is rolled forward by ``recover`` (the trainer's start, under its lock, and ``settle`` for a reader such as
``tfx.evaluate`` when no trainer holds the folder). Tests kill at every step through ``STEP_HOOK``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from tfx.files.atomic import atomic_open

JOURNAL = ".save.json"
LOCK = ".lock"  # the trainer's lock file (tfx.checkpoints.manager)

# Called with a short label before each file-system step of a save (tests kill the process there).
STEP_HOOK: Callable[[str], None] | None = None


def _step(label: str) -> None:
    if STEP_HOOK is not None:
        STEP_HOOK(label)


def _fsync_dir(folder: Path) -> None:
    """Make the renames and removals in ``folder`` durable (a power loss, not only a kill)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SaveTransaction:
    """Files staged under hidden temp names, then published together by ``commit``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._staged: dict[str, str] = {}  # final name -> temp name
        self._removed: list[str] = []

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[IO[bytes]]:
        """A binary file to fill; it is published as ``name`` at ``commit`` (removed if the block fails)."""
        _step(f"stage {name}")
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=self.folder)
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._staged[name] = Path(tmp).name

    def copy(self, source: str, name: str) -> None:
        """Stage ``name`` as a copy of the already staged ``source`` (the best and numbered weights are one)."""
        with open(self.folder / self._staged[source], "rb") as src, self.stage(name) as dst:
            shutil.copyfileobj(src, dst, 16 * 2**20)

    def remove(self, name: str) -> None:
        """Remove ``name`` when the transaction commits (a pruned or superseded numbered checkpoint)."""
        self._removed.append(name)

    def commit(self) -> None:
        """Write the journal (the point of no return), publish every staged file, remove the old ones."""
        _step("journal")
        with atomic_open(self.folder / JOURNAL, "w") as f:
            json.dump({"publish": self._staged, "remove": self._removed}, f)
        _fsync_dir(self.folder)
        roll_forward(self.folder)

    def abort(self) -> None:
        """Remove what was staged (a save that failed before its commit: the previous files stand)."""
        for tmp in self._staged.values():
            (self.folder / tmp).unlink(missing_ok=True)
        self._staged.clear()


def roll_forward(folder: Path) -> bool:
    """Finish a committed save from its journal (idempotent: a step already done is skipped); True if one was."""
    journal = folder / JOURNAL
    try:
        plan = json.loads(journal.read_text())
    except FileNotFoundError:
        return False
    for name, tmp in plan["publish"].items():
        if (folder / tmp).exists():  # else: renamed before the kill
            _step(f"publish {name}")
            os.replace(folder / tmp, folder / name)
    for name in plan["remove"]:
        _step(f"remove {name}")
        (folder / name).unlink(missing_ok=True)
    _fsync_dir(folder)
    _step("end")
    journal.unlink()
    return True


def recover(folder: Path) -> tuple[bool, list[tuple[Path, int]]]:
    """At a trainer's start, under its lock: finish a committed save, then remove uncommitted temp files.

    Returns whether a save was finished, and each removed temp file with its size."""
    finished = roll_forward(folder)
    removed = []
    for tmp in folder.glob(".*.tmp"):
        removed.append((tmp, tmp.stat().st_size))
        tmp.unlink(missing_ok=True)
    return finished, removed


def settle(folder: Path) -> None:
    """For a reader (``tfx.evaluate``, ``tfx.average``): finish a save that a killed trainer committed, if no
    trainer holds the folder now and it can be written; otherwise leave it (the trainer finishes it)."""
    if not (folder / JOURNAL).exists():
        return
    try:
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return  # read-only: the reader sees the folder as it is
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        roll_forward(folder)
    except OSError:
        pass  # a trainer holds it (it finishes the save itself), or the folder cannot be written
    finally:
        os.close(fd)

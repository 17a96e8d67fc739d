"""Atomic file writes: a reader, or a crash mid-write, never sees a partial file.

The lowest layer of tfx's file handling (below ``tfx.data``, ``tfx.checkpoints.load`` and the
trainer), so the vocabulary cache, checkpoints, metrics and translations all write the same way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import torch

from tfx.files.environment import writing


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "wb", **kwargs: Any) -> Iterator[IO]:
    """A temp file beside ``path``; on success fsynced and renamed over it, on any failure removed.

    A crash or SIGKILL mid-write leaves the previous good file untouched. The file gets the
    usual umask permissions (``mkstemp`` alone makes it owner-only, unreadable to a team). A full
    disk's error names ``path``, not the temp file or nothing (``tfx.files.environment.writing``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with writing(path):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, mode, **kwargs) as f:
                os.fchmod(f.fileno(), 0o666 & ~_umask())
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def atomic_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` through ``atomic_open``: never a partial checkpoint under ``path``."""
    with atomic_open(path) as f:
        torch.save(obj, f)


def atomic_copy(src: str | Path, dst: str | Path) -> None:
    """Copy a finished checkpoint under another name without ever exposing a partial file."""
    with open(src, "rb") as source, atomic_open(dst) as target:
        shutil.copyfileobj(source, target, 16 * 2**20)

"""Failures of the machine, not of tfx or its input: a full disk, a read-only or forbidden folder, a file that
vanished, the host out of memory. Each entry point turns them into one line naming the path and what to do
(``environment_errors``), where a traceback would read like a bug; an error of any other kind keeps its traceback.

Writes go through ``atomic_open``, so such a failure leaves the previous file whole and no partial one; a write
to an open file reports a full disk without a path, so ``writing`` names the file it was writing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

# torch's CPU allocator reports a failed allocation as a plain RuntimeError, not as MemoryError
_HOST_ALLOCATOR = "DefaultCPUAllocator: can't allocate memory"
_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class Remedy:
    """What a user of one entry point can change: the settings that name the folders it writes (``data.cache_dir``,
    ``--output``), each with its folder, and what lowers its memory."""

    folders: Mapping[str, str | Path | None] = field(default_factory=dict)
    memory: str = "use a machine with more memory"


def chain(err: BaseException) -> Iterator[BaseException]:
    """``err``, then what caused it (``raise ... from``) or what it interrupted, down to the first."""
    seen: BaseException | None = err
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def is_disk_full(err: BaseException) -> bool:
    """ENOSPC anywhere in the chain: torch.save reports it as an 'unexpected pos' RuntimeError."""
    return any(isinstance(seen, OSError) and seen.errno == errno.ENOSPC for seen in chain(err))


def environment_cause(err: BaseException) -> OSError | MemoryError | RuntimeError | None:
    """The failure of the machine behind ``err``, or None. Only plain RuntimeErrors (torch's wrappers) are looked
    through: a tfx error explains itself, and a bug raised while handling an OSError is still a bug."""
    for seen in chain(err):
        if isinstance(seen, MemoryError) or (isinstance(seen, OSError) and seen.errno is not None):
            return seen
        if type(seen) is not RuntimeError:
            return None
        if _HOST_ALLOCATOR in str(seen):
            return seen
    return None


def explain(err: BaseException, remedy: Remedy = Remedy()) -> str | None:
    """One line for a failure of the machine: what happened, the path, what to do; None for anything else."""
    cause = environment_cause(err)
    if cause is None:
        return None
    if not isinstance(cause, OSError):
        return f"out of memory on the host: {remedy.memory}"
    path = cause.filename
    setting = _setting_for(path, remedy.folders)
    if cause.errno in _FULL:
        what = "no space left on device" if cause.errno == errno.ENOSPC else "disk quota exceeded"
        if path is None:
            return f"{what}: {_free_space(remedy.folders)}"
        elsewhere = f"point {setting} at another disk" if setting else "write it to another disk"
        return f"{what} writing {path}: free space there, or {elsewhere}"
    if path is None:  # an unnamed failure of another kind: say what it was
        return f"{cause.strerror or os.strerror(cause.errno)}: check the disks this command writes, then run again"
    writable = f"point {setting} at a folder you can write" if setting else "choose a folder you can write"
    if cause.errno == errno.EROFS:
        return f"read-only file system: cannot write {path}: {writable}"
    if cause.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied: {path}: check its permissions and its folder's (ls -ld), or {writable}"
    if cause.errno == errno.ENOENT:
        return f"{path} does not exist (any more?): check the path, and that nothing moves or deletes it meanwhile"
    return f"{cause.strerror or os.strerror(cause.errno)}: {path}: check the disk and the path, then run again"


def _setting_for(path: str | None, folders: Mapping[str, str | Path | None]) -> str | None:
    """The setting whose folder holds ``path`` (the deepest one), or None."""
    if path is None:
        return None
    target = Path(os.path.abspath(path))
    holding = []
    for name, folder in folders.items():
        if folder is not None and (where := Path(os.path.abspath(folder))) in (target, *target.parents):
            holding.append((len(where.parts), name))
    return max(holding)[1] if holding else None


def _free_space(folders: Mapping[str, str | Path | None]) -> str:
    named = [f"{name}={folder}" for name, folder in folders.items() if folder is not None]
    if not named:
        return "free space on the disk being written, then run again"
    return f"free space on the disk of {', '.join(named)}, or point it at another disk"


def with_path(err: BaseException, path: str | Path) -> BaseException:
    """``err``, or an OSError naming ``path`` (caused by ``err``) when ``err`` is a full disk that names no file (a
    write to an open file names none) or a failure of a file beside ``path`` (``atomic_open``'s temporary one)."""
    cause = environment_cause(err)
    if not isinstance(cause, OSError) or cause.filename == str(path):
        return err
    unnamed_full = cause.filename is None and cause.errno in _FULL
    beside = cause.filename is not None and Path(str(cause.filename)).parent == Path(path).parent
    if not (unnamed_full or beside):
        return err
    named = OSError(cause.errno, cause.strerror, str(path))
    named.__cause__ = err
    return named


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Errors raised inside name ``path`` when they do not name it themselves (``with_path``)."""
    try:
        yield
    except BaseException as err:
        named = with_path(err, path)
        if named is err:
            raise
        raise named from err


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


@contextlib.contextmanager
def environment_errors(
    program: str, remedy: Remedy = Remedy(), report: Callable[[str], None] = _to_stderr
) -> Iterator[None]:
    """Around an entry point's work: a failure of the machine is reported as ``program: <one line>`` and exits 1
    (``SystemExit``, after ``atomic_open`` has removed what was half written); anything else propagates."""
    try:
        yield
    except Exception as err:  # MemoryError included; KeyboardInterrupt and SystemExit pass through
        line = explain(err, remedy)
        if line is None:
            raise
        report(f"{program}: {line}")
        raise SystemExit(1) from None

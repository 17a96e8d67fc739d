"""Failures of the machine as one line (tfx/files/environment.py); atomic_open names the file a full disk stopped.

No model and no tensor math: precision and device do not apply. Full disks, read-only folders and missing memory
are raised by stand-ins (tests run as root, whom chmod does not stop, and no small filesystem can be mounted here).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tfx.data import DataError
from tfx.files import atomic
from tfx.files.atomic import atomic_open
from tfx.files.environment import Remedy, environment_errors, explain, is_disk_full, with_path

REMEDY = Remedy({"data.cache_dir": "/data/cache", "hydra.run.dir": "/runs/x"}, memory="lower data.max_tokens")


def os_error(code: int, filename: str | None = None) -> OSError:
    return OSError(code, os.strerror(code), filename) if filename else OSError(code, os.strerror(code))


@pytest.mark.parametrize(
    ("err", "line"),
    [
        (os_error(errno.ENOSPC, "/data/cache/enc.tok"),
         "no space left on device writing /data/cache/enc.tok: free space there, or point data.cache_dir at another "
         "disk"),
        (os_error(errno.ENOSPC),
         "no space left on device: free space on the disk of data.cache_dir=/data/cache, hydra.run.dir=/runs/x, or "
         "point it at another disk"),
        (os_error(errno.EROFS, "/runs/x/checkpoints/a.pt"),
         "read-only file system: cannot write /runs/x/checkpoints/a.pt: point hydra.run.dir at a folder you can "
         "write"),
        (os_error(errno.EACCES, "/elsewhere/f"),
         "permission denied: /elsewhere/f: check its permissions and its folder's (ls -ld), or choose a folder you "
         "can write"),
        (os_error(errno.ENOENT, "/data/train.de"),
         "/data/train.de does not exist (any more?): check the path, and that nothing moves or deletes it meanwhile"),
        (MemoryError(), "out of memory on the host: lower data.max_tokens"),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                      "you tried to allocate 1125899906842624 bytes. Error code 12 (Cannot allocate memory)"),
         "out of memory on the host: lower data.max_tokens"),
        (os_error(errno.EIO), "Input/output error: check the disks this command writes, then run again"),
        (os_error(errno.EIO, "/data/cache/enc.tok"),
         "Input/output error: /data/cache/enc.tok: check the disk and the path, then run again"),
    ],
)  # fmt: skip
def test_each_failure_of_the_machine_is_one_line_naming_the_path_and_what_to_do(err: BaseException, line: str) -> None:
    assert explain(err, REMEDY) == line


def test_the_deepest_setting_holding_the_path_is_the_one_named() -> None:
    remedy = Remedy({"hydra.run.dir": "/runs/x", "data.cache_dir": "/runs/x/cache", "unset": None})
    assert explain(os_error(errno.ENOSPC, "/runs/x/cache/a"), remedy).endswith("point data.cache_dir at another disk")
    assert explain(os_error(errno.ENOSPC, "/runs/x/tb/a"), remedy).endswith("point hydra.run.dir at another disk")


def unexpected_pos() -> RuntimeError:
    """What torch.save raises when the file under it reports ENOSPC: a plain RuntimeError, raised while handling it."""
    err = RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0")
    err.__context__ = os_error(errno.ENOSPC)
    return err


def test_torchs_wrapper_is_looked_through_but_tfx_errors_and_bugs_are_not() -> None:
    """A tfx error raised from an OSError explains itself better; a KeyError raised while handling one is a bug and
    keeps its traceback."""
    assert explain(unexpected_pos()).startswith("no space left on device")
    assert is_disk_full(unexpected_pos())
    for outer in (DataError("data.local_dir=x: no such folder"), KeyError("step")):
        try:
            try:
                raise os_error(errno.ENOENT, "/x")
            except OSError as err:
                raise outer from err
        except Exception as raised:  # noqa: BLE001 - whatever it is, explain decides
            assert explain(raised) is None
    assert explain(OSError("Not a gzipped file (b'xx')")) is None  # no errno: a library's message, not the machine
    assert explain(ValueError("bug")) is None


def test_environment_errors_reports_one_line_and_exits_1_and_lets_anything_else_through() -> None:
    lines: list[str] = []
    with pytest.raises(SystemExit) as stopped, environment_errors("tfx.x", REMEDY, report=lines.append):
        raise os_error(errno.ENOSPC, "/data/cache/enc.tok")
    assert stopped.value.code == 1 and stopped.value.__suppress_context__  # no traceback of the OSError
    assert lines == [f"tfx.x: {explain(os_error(errno.ENOSPC, '/data/cache/enc.tok'), REMEDY)}"]
    with pytest.raises(ZeroDivisionError), environment_errors("tfx.x", REMEDY, report=lines.append):
        _ = 1 / 0
    with pytest.raises(KeyboardInterrupt), environment_errors("tfx.x", REMEDY, report=lines.append):
        raise KeyboardInterrupt
    assert len(lines) == 1


def test_with_path_names_the_target_for_an_unnamed_full_disk_or_a_temp_file_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    named = with_path(os_error(errno.ENOSPC), target)
    assert (named.errno, named.filename) == (errno.ENOSPC, str(target))
    assert with_path(os_error(errno.EROFS, str(tmp_path / ".a.txt.x1.tmp")), target).filename == str(target)
    for kept in (os_error(errno.EACCES, "/elsewhere/folder"), os_error(errno.EIO), ValueError("bug")):
        assert with_path(kept, target) is kept


def test_a_full_disk_in_atomic_open_names_the_file_keeps_the_old_one_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync can be where a full disk shows (delayed allocation, network filesystems); a write's error names no file."""
    path = tmp_path / "out.txt"
    path.write_text("the good old file\n")

    def no_space(fd: int) -> None:
        raise os_error(errno.ENOSPC)

    monkeypatch.setattr(atomic.os, "fsync", no_space)
    with pytest.raises(OSError) as raised, atomic_open(path, "w") as f:
        f.write("new\n")
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(path))
    assert path.read_text() == "the good old file\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_read_only_folder_in_atomic_open_names_the_file_not_its_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As mkstemp fails in a read-only folder (EROFS): the error names the file the user asked for."""

    def read_only(prefix: str, suffix: str, dir: Path) -> tuple[int, str]:  # noqa: A002 - mkstemp's own name
        raise os_error(errno.EROFS, str(Path(dir) / f"{prefix}k2j3{suffix}"))

    monkeypatch.setattr(atomic.tempfile, "mkstemp", read_only)
    with pytest.raises(OSError) as raised, atomic_open(tmp_path / "out.txt", "w"):
        pass
    assert raised.value.filename == str(tmp_path / "out.txt")
    assert (
        explain(raised.value)
        == f"read-only file system: cannot write {tmp_path / 'out.txt'}: choose a folder you can write"
    )

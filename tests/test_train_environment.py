"""``python -m tfx.train`` when the machine fails it (issue 69): one line naming the path and what to do, exit 1.

The Hydra entry runs in this process (``tfx.train.main`` with ``sys.argv`` set) on the toy task; each failure is
raised by a stand-in while the data cache is prepared (tests run as root, whom chmod does not stop, and no small
filesystem can be mounted here), so no model is built: CPU, and precision does not apply.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tfx.train as train_mod
from tfx.data import store
from tfx.files import atomic


@pytest.fixture(autouse=True)
def _hydra_logging_undone() -> Iterator[None]:
    """Hydra points the root logger at this test's stdout and train.log: undo that for the tests after it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:], root.level = handlers, level


def run_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> tuple[str, str]:
    """(exit code, stdout + stderr) of ``python -m tfx.train`` on the toy task, data cache under ``tmp_path/cache``."""
    argv = ["tfx.train", f"hydra.run.dir={tmp_path / 'run'}", f"data.cache_dir={tmp_path / 'cache'}",
            "train.progress=false", "train.threads=1", "train.device=cpu"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stopped:
        train_mod.main()
    out = capsys.readouterr()
    return stopped.value.code, out.out + out.err


def one_line(code: int, output: str, run: Path, expected: str) -> None:
    """Exit 1, ``expected`` on exactly one line of the console and in train.log, and no traceback."""
    assert code == 1, output
    assert "Traceback" not in output, output
    assert sum(expected in line for line in output.splitlines()) == 1, output
    assert expected in (run / "train.log").read_text()


def test_a_full_disk_while_preparing_the_data_cache_is_one_line_and_leaves_nothing_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The token store's writes go to an open file, whose ENOSPC names no path: the line names the store."""

    def no_space(self: store.StoreWriter, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store.StoreWriter, "_write", no_space)
    code, output = run_cli(tmp_path, monkeypatch, capsys)
    cache = tmp_path / "cache"
    one_line(code, output, tmp_path / "run", f"tfx.train: no space left on device writing {cache}/enc-")
    assert ".tok: free space there, or point data.cache_dir at another disk" in output
    left = sorted(p.name for p in cache.iterdir())  # the sentencepiece model, whole; no store, no temp file
    assert len(left) == 2 and left[0] == ".gitignore" and left[1].startswith("spm-"), left


def test_a_read_only_cache_folder_is_one_line_naming_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """mkstemp in a read-only folder fails with EROFS naming its temp file; the line names the file and the setting."""
    real_mkstemp = atomic.tempfile.mkstemp

    def read_only_cache(prefix: str, suffix: str, dir: Path) -> tuple[int, str]:  # noqa: A002 - mkstemp's name
        if Path(dir) == tmp_path / "cache":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(Path(dir) / f"{prefix}x1y2{suffix}"))
        return real_mkstemp(prefix=prefix, suffix=suffix, dir=dir)

    monkeypatch.setattr(atomic.tempfile, "mkstemp", read_only_cache)
    code, output = run_cli(tmp_path, monkeypatch, capsys)
    expected = f"tfx.train: read-only file system: cannot write {tmp_path / 'cache'}/"
    one_line(code, output, tmp_path / "run", expected)
    assert "point data.cache_dir at a folder you can write" in output


def test_the_host_out_of_memory_is_one_line_saying_what_to_lower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def no_memory(self: store.StoreWriter, data: bytes) -> None:
        raise MemoryError

    monkeypatch.setattr(store.StoreWriter, "_write", no_memory)
    code, output = run_cli(tmp_path, monkeypatch, capsys)
    expected = "tfx.train: out of memory on the host: lower data.max_tokens, data.num_workers or train.threads"
    one_line(code, output, tmp_path / "run", expected)


def test_a_bug_keeps_its_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only failures of the machine become one line: anything else is raised as it was (Hydra prints it)."""

    def bug(self: store.StoreWriter, data: bytes) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(store.StoreWriter, "_write", bug)
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # Hydra raises instead of printing and exiting
    monkeypatch.setattr(sys, "argv", ["tfx.train", f"hydra.run.dir={tmp_path / 'run'}",
                                      f"data.cache_dir={tmp_path / 'cache'}", "train.progress=false"])  # fmt: skip
    with pytest.raises(KeyError, match="a bug"):
        train_mod.main()


def test_sigint_during_data_preparation_is_one_line_and_exit_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Ctrl-C before the loop takes the stop signals over (here: while the token store is written) ended in a
    KeyboardInterrupt traceback; the cache keeps no half-written entry (atomic writes)."""

    def interrupted(self: store.StoreWriter, data: bytes) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(store.StoreWriter, "_write", interrupted)
    code, output = run_cli(tmp_path, monkeypatch, capsys)
    assert code == 130 and "Traceback" not in output, output
    assert "tfx.train: interrupted by SIGINT before the first update: nothing to save" in output
    assert not list((tmp_path / "cache").glob("enc-*"))

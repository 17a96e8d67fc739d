"""The command line's run folder: a re-run of the same command resumes the unfinished run it meant to continue,
and a start that fails before its first update leaves no folder behind (issue 67).

Hydra names each command-line run's folder by the time (``outputs/<experiment>/<method>/<time>``) and has made it,
with ``.hydra/`` and ``train.log``, before tfx code runs. ``resume_unfinished`` swaps it for the newest unfinished
run of the same settings beside it (``tfx.checkpoints.unfinished``): the log file follows, the new empty folder
goes. ``discard_failed_start`` removes a new folder whose run never updated (a wrong ``data.local_dir``, a bad
``model.norm``, the hub unreachable), so "the latest run" is always one that ran.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from tfx.checkpoints.unfinished import find_unfinished, try_lock
from tfx.config import Config

log = logging.getLogger("tfx.train")

HYDRA_FILES = {".hydra", "train.log"}  # what Hydra puts in a new run folder before tfx runs


@dataclass(frozen=True)
class Launch:
    """How the command line started a run: the command that resumes it (the stop message prints it), and the
    lock of the unfinished run it resumes, already taken (``tfx.checkpoints.unfinished``)."""

    command: str | None = None
    held_lock: int | None = None


def command_line(argv: list[str]) -> str:
    """The command as typed again: ``python -m tfx.train ARGS``."""
    return shlex.join(["python", "-m", "tfx.train", *argv])


def claim_new_folder(run_dir: Path) -> tuple[Path, int]:
    """``run_dir`` with its lock taken; Hydra names the folder by the second, so of two commands started in the
    same second the first to lock it keeps it and the other moves to ``<name>_<pid>`` (its own config and log)."""
    fd = try_lock(run_dir)
    if fd is not None:
        return run_dir, fd
    own = run_dir.with_name(f"{run_dir.name}_{os.getpid()}")
    try:
        shutil.copytree(run_dir / ".hydra", own / ".hydra")  # the same command: the same config
    except OSError:  # the other process resumed an earlier run and removed the shared folder meanwhile
        own.mkdir(parents=True, exist_ok=True)
        log.warning("%s has no .hydra/ (the folder it came from went): a later re-run will not find it to resume", own)
    move_file_logs(run_dir, own)
    fd = try_lock(own)
    assert fd is not None, own  # a name of this process's own
    return own, fd


def resume_unfinished(run_dir: Path, cfg: Config, argv: list[str]) -> tuple[Path, Launch, bool]:
    """The folder a command-line run trains in, its lock taken, and whether it is an earlier run's: the newest
    unfinished run of the same settings beside Hydra's new ``run_dir`` if there is one (``train.resume=auto``, the
    default), else ``run_dir`` (or ``<run_dir>_<pid>``, ``claim_new_folder``)."""
    command = command_line(argv)
    run_dir, own_lock = claim_new_folder(run_dir)
    if cfg.train.resume not in ("auto", None):
        return run_dir, Launch(command, own_lock), False
    found, passed_over = find_unfinished(run_dir, cfg)
    if found is None:
        if passed_over:
            log.info("%s", passed_over)
        return run_dir, Launch(command, own_lock), False
    log.info("re-run of the same command: resuming the unfinished run %s (%s; train.resume=never starts a new one)",
             found.folder, found.status)  # fmt: skip
    move_file_logs(run_dir, found.folder)
    os.close(own_lock)
    discard(run_dir)
    return found.folder, Launch(command, found.held_lock), True


def file_logs_in(folder: Path) -> list[logging.FileHandler]:
    """The root logger's file handlers that write into ``folder`` (Hydra's ``train.log``)."""
    found = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    return [h for h in found if Path(h.baseFilename).parent == folder.resolve()]


def move_file_logs(old: Path, new: Path) -> None:
    """Point the log files Hydra opened in ``old`` at the same names in ``new`` (appending)."""
    root = logging.getLogger()
    for handler in file_logs_in(old):
        moved = logging.FileHandler(new / Path(handler.baseFilename).name, mode="a")
        moved.setFormatter(handler.formatter)
        moved.setLevel(handler.level)
        root.removeHandler(handler)
        handler.close()
        root.addHandler(moved)


def discard(run_dir: Path) -> None:
    """Remove a run folder that holds only what Hydra wrote, and what a start before its first update left
    (an empty ``checkpoints/`` with its lock, TensorBoard's first file, a ``metrics.jsonl`` without updates)."""
    if run_dir.is_dir() and never_updated(run_dir):
        for handler in file_logs_in(run_dir):  # stop writing there first
            handler.close()
            logging.getLogger().removeHandler(handler)
        shutil.rmtree(run_dir, ignore_errors=True)


def never_updated(run_dir: Path) -> bool:
    """No checkpoint and no update record: nothing of the run would be lost."""
    if any((run_dir / "checkpoints").glob("*.pt")):
        return False
    metrics = run_dir / "metrics.jsonl"
    return not metrics.exists() or '"event": "update"' not in metrics.read_text(errors="replace")


def discard_failed_start(run_dir: Path) -> None:
    """After a failure: remove the command line's new run folder if its run never updated."""
    if never_updated(run_dir):
        log.info("the run did not start: removed its folder %s", run_dir)
        discard(run_dir)

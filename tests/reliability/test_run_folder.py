"""The run folder: one trainer at a time, writable before any work, temp files of killed saves
removed, and a full disk reported in one line with the previous checkpoint kept."""

from __future__ import annotations

import errno
import io
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.reliability.helpers import cli, read_only, tiny_cfg
from tfx.checkpoints.load import CheckpointError, load_checkpoint
from tfx.checkpoints.manager import CheckpointManager
from tfx.train import train


def test_a_second_manager_in_the_same_folder_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = CheckpointManager(tmp_path / "run", keep_last=1)
    first.open()
    try:
        with pytest.raises(CheckpointError, match=rf"run folder {tmp_path / 'run'} is in use .*pid {os.getpid()}\)"):
            train(tiny_cfg(tmp_path, max_updates=2), tmp_path / "run")
    finally:
        first.close()
    assert train(tiny_cfg(tmp_path, max_updates=2), tmp_path / "run")["step"] == 2  # released: usable again


@pytest.mark.slow
def test_a_second_trainer_exits_non_zero_naming_the_folder_and_the_holder_pid(tmp_path: Path) -> None:
    """The lock a running trainer holds, held here (a first trainer would only add its start-up time)."""
    run_dir = tmp_path / "run"
    first = CheckpointManager(run_dir, keep_last=1)
    first.open()
    try:
        second = cli(f"hydra.run.dir={run_dir}", f"data.cache_dir={tmp_path / 'cache'}", "train.max_updates=2")
    finally:
        first.close()
    output = second.stdout + second.stderr
    assert second.returncode == 1, output[-2000:]
    assert f"run folder {run_dir} is in use by another trainer (pid {os.getpid()})" in output
    assert "Traceback" not in output and not (tmp_path / "cache").exists()


def test_stale_temp_files_are_removed_at_start(tmp_path: Path) -> None:
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    stale = [ckpts / ".checkpoint_last.pt.k1ll3d.tmp", ckpts / ".checkpoint_best.pt.abc123.tmp"]
    for path in stale:
        path.write_bytes(b"\0" * 1000)
    keep = ckpts / "notes.txt"
    keep.write_text("mine")
    train(tiny_cfg(tmp_path, max_updates=1), tmp_path / "run")
    assert not any(p.exists() for p in stale) and keep.exists()


def test_a_read_only_run_folder_fails_before_data_preparation(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with read_only(run), pytest.raises(CheckpointError, match=rf"run folder {run} is not writable"):
        train(tiny_cfg(tmp_path), run)
    assert not (tmp_path / "cache").exists()  # no data was prepared


def test_a_read_only_checkpoint_folder_fails_before_data_preparation(tmp_path: Path) -> None:
    ckpts = tmp_path / "run" / "checkpoints"
    with read_only(ckpts), pytest.raises(CheckpointError, match=rf"checkpoint folder {ckpts} is not writable"):
        train(tiny_cfg(tmp_path), tmp_path / "run")
    assert not (tmp_path / "cache").exists()


def one_line_failure(proc: subprocess.CompletedProcess, expected: str) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-2000:]
    assert expected in output and "Traceback" not in output, output[-2000:]
    assert sum(expected in line for line in output.splitlines()) == 1, output[-2000:]


@pytest.mark.slow
def test_cli_run_folder_under_proc_is_one_line(tmp_path: Path) -> None:
    one_line_failure(cli("hydra.run.dir=/proc/x/run", f"data.cache_dir={tmp_path / 'cache'}"), "hydra.run.dir=/proc/x")


@pytest.mark.slow
def test_cli_read_only_existing_run_folder_is_one_line(tmp_path: Path) -> None:
    """Hydra's log file handler would fail first: the check runs before Hydra opens train.log."""
    with read_only(tmp_path / "run") as run:
        one_line_failure(cli(f"hydra.run.dir={run}", f"data.cache_dir={tmp_path / 'cache'}"), f"{run} is not writable")


class FullDisk(io.RawIOBase):
    """A file whose writes fail with ENOSPC after ``room`` bytes, as a full filesystem's do."""

    def __init__(self, target, room: int) -> None:
        self.target, self.room = target, room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self.room < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.target.write(data)


def test_disk_full_names_the_file_and_the_last_good_checkpoint(tmp_path: Path, monkeypatch) -> None:
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("step") == 4 and "optimizer" in obj:  # checkpoint_last.pt at update 4
            f = FullDisk(f, room=4096)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    cfg = tiny_cfg(tmp_path, max_updates=6, save_every_updates=2)
    ckpts = tmp_path / "run" / "checkpoints"
    last = ckpts / "checkpoint_last.pt"
    message = rf"no space left on device writing {last}; the last good checkpoint is {last} \(update 2\)"
    with pytest.raises(CheckpointError, match=message):
        train(cfg, tmp_path / "run")
    assert load_checkpoint(last)["step"] == 2  # the previous checkpoint survives
    assert not list(ckpts.glob(".*.tmp"))


@pytest.mark.slow
def test_cli_disk_full_on_a_tiny_tmpfs(tmp_path: Path) -> None:
    """A real full filesystem, where a small tmpfs can be mounted (root); skipped elsewhere."""
    run = tmp_path / "run"
    run.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2400k", "tmpfs", str(run)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        proc = cli(f"hydra.run.dir={run}", f"data.cache_dir={tmp_path / 'cache'}", "train.max_updates=40",
                   "train.save_every_updates=1", "train.keep_last=100")  # fmt: skip
        output = proc.stdout + proc.stderr
        assert proc.returncode == 1 and "Traceback" not in output, output[-2000:]
        assert "no space left on device writing" in output, output[-2000:]
        last = run / "checkpoints" / "checkpoint_last.pt"
        assert f"the last good checkpoint is {last} (update {load_checkpoint(last)['step']})" in output
    finally:
        subprocess.run(["umount", str(run)], check=False)

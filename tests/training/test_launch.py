"""The command line's run folder (issue 67): re-running the identical command resumes the unfinished run it meant to
continue, never a finished one, never one of other settings, never one another process holds; a start that fails
before its first update leaves no folder.

Each test runs ``python -m tfx.train`` as a user would (no ``hydra.run.dir``: Hydra names the folder by the time)
in a folder of its own, on the toy task with the tiny model of ``tests.test_train`` (CPU, fp32, one thread).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.test_train import TINY_OVERRIDES
from tfx.checkpoints.load import load_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.fixed_precision]  # fp32 pinned by TINY_OVERRIDES

RUN = [*TINY_OVERRIDES, "train.max_updates=60", "train.save_every_updates=5", "train.validate_every_updates=0"]


def command(cwd: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tfx.train", f"data.cache_dir={cwd.parent / 'cache'}", *RUN, *extra]


def runs(cwd: Path) -> list[Path]:
    root = cwd / "outputs" / "toy" / "tfixup"
    return sorted(root.iterdir()) if root.is_dir() else []


def run_to_end(cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(command(cwd, *extra), cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def interrupt(cwd: Path, sig: int, after_step: int) -> str:
    """Start the command, send ``sig`` once it has saved a checkpoint past ``after_step``; its output."""
    started = time.time()
    proc = subprocess.Popen(command(cwd), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while time.time() < started + 180 and proc.poll() is None:
        lasts = [r / "checkpoints" / "checkpoint_last.pt" for r in runs(cwd)]
        saved = [p for p in lasts if p.exists() and p.stat().st_mtime > started]  # by this process
        if any(load_checkpoint(p)["step"] > after_step for p in saved):
            break
        time.sleep(0.1)
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode in (0, -signal.SIGKILL), output[-2000:]
    return output


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoints" / "checkpoint_last.pt")["model"]


def test_sigint_sigterm_and_sigkill_then_the_same_command_resumes_to_the_uninterrupted_weights(tmp_path: Path) -> None:
    reference, work = tmp_path / "reference", tmp_path / "work"
    reference.mkdir(), work.mkdir()
    run_to_end(reference)
    first = interrupt(work, signal.SIGINT, after_step=0)
    assert "run the same command to resume: python -m tfx.train" in first
    assert "resuming the unfinished run" in interrupt(work, signal.SIGTERM, after_step=15)
    interrupt(work, signal.SIGKILL, after_step=30)
    last = run_to_end(work)
    assert "resuming the unfinished run" in last.stdout + last.stderr
    (run,) = runs(work)  # every relaunch went on in the one folder
    (ref,) = runs(reference)
    ours, theirs = final_weights(run), final_weights(ref)
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=0, msg=name)


def test_a_finished_run_is_not_resumed_and_a_changed_setting_starts_fresh_saying_why(tmp_path: Path) -> None:
    run_to_end(tmp_path)
    again = run_to_end(tmp_path)
    assert "resuming" not in again.stdout + again.stderr and len(runs(tmp_path)) == 2
    interrupt(tmp_path, signal.SIGTERM, after_step=0)
    changed = run_to_end(tmp_path, "optim.lr=0.001")
    output = changed.stdout + changed.stderr
    assert "not resuming the unfinished run" in output and "settings differ: optim.lr (0.002 -> 0.001)" in output
    assert len(runs(tmp_path)) == 4


def test_two_identical_commands_at_once_do_not_share_a_folder(tmp_path: Path) -> None:
    """Started together (Hydra names both folders by the same second, and both see the one unfinished run): one
    resumes that run, the other trains a new one in a folder of its own."""
    interrupt(tmp_path, signal.SIGTERM, after_step=0)
    procs = [subprocess.Popen(command(tmp_path), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]  # fmt: skip
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sum("resuming the unfinished run" in out for out in outputs) == 1
    folders = runs(tmp_path)
    assert len(folders) == 2 and all(load_checkpoint(final)["step"] == 60 for final in
                                     (f / "checkpoints" / "checkpoint_last.pt" for f in folders))  # fmt: skip


def test_a_start_that_fails_before_its_first_update_leaves_no_folder(tmp_path: Path) -> None:
    done = subprocess.run(command(tmp_path, "data.source=local", f"data.local_dir={tmp_path / 'nowhere'}"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1 and "nowhere" in done.stdout + done.stderr
    assert runs(tmp_path) == []

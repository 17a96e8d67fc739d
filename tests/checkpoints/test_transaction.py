"""A save is all or nothing across its files: SIGKILL-like exits (``os._exit`` from ``STEP_HOOK``) at every
write, rename and removal of a save leave the files of the save before or of the save after (issue 69).

The trainer's test forks a child per kill point that resumes a tiny toy run (2+2 layers, d 32, CPU, fp32, one
thread) and dies inside the save of an epoch end that writes checkpoint_best.pt, a numbered checkpoint and
prunes an old one; the folder is then compared with the folders an uninterrupted run left after each save.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import tfx.checkpoints.transaction as transaction
from tests.test_train import tiny_cfg
from tfx.checkpoints.load import load_checkpoint
from tfx.checkpoints.numbered import checkpoint_dir
from tfx.checkpoints.transaction import JOURNAL, SaveTransaction, recover, settle
from tfx.train import train

# fp32 pinned (tiny_cfg): CI runs these in its first pass only (docs/testing.md)
pytestmark = pytest.mark.fixed_precision

torch.set_num_threads(1)


def visible(folder: Path) -> dict[str, bytes]:
    """The files a user sees (not the hidden temp files, journal and lock), with their contents."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.startswith(".")}


def labels_of(action) -> list[str]:
    """The file-system steps ``action`` takes, in order (``STEP_HOOK`` recording, no kill)."""
    seen: list[str] = []
    transaction.STEP_HOOK = seen.append
    try:
        action()
    finally:
        transaction.STEP_HOOK = None
    return seen


def killed_at(label_index: int, action) -> None:
    """Run ``action`` in a forked child that exits at once (no cleanup, as SIGKILL) at its ``label_index``-th step."""
    pid = os.fork()
    if pid == 0:
        count = iter(range(10**6))

        def die(label: str) -> None:
            if next(count) == label_index:
                os._exit(9)

        transaction.STEP_HOOK = die
        try:
            action()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9, "the child did not reach its kill point"


def old_folder(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in {"last": b"old last", "best": b"old best", "n1": b"n1", "n2": b"n2"}.items():
        (folder / name).write_bytes(text)


def new_save(folder: Path) -> None:
    tx = SaveTransaction(folder)
    for name in ("best", "n3", "last"):
        with tx.stage(name) as f:
            f.write(f"new {name}".encode())
    tx.remove("n1")
    tx.commit()


def test_a_kill_at_every_step_leaves_the_old_files_or_after_recovery_the_new(tmp_path: Path) -> None:
    old_folder(tmp_path / "probe")
    steps = labels_of(lambda: new_save(tmp_path / "probe"))
    after = visible(tmp_path / "probe")
    assert after == {"best": b"new best", "last": b"new last", "n2": b"n2", "n3": b"new n3"}
    assert steps[:4] == ["stage best", "stage n3", "stage last", "journal"] and steps[-1] == "end"
    for k, label in enumerate(steps):
        folder = tmp_path / f"kill{k}"
        old_folder(folder)
        before = visible(folder)
        killed_at(k, lambda folder=folder: new_save(folder))
        committed = (folder / JOURNAL).exists()  # killed after the journal: the save is to be finished
        assert committed or visible(folder) == before, label  # before it: untouched, the staged files hidden
        assert recover(folder)[0] == committed, label
        assert visible(folder) == (after if committed else before), label
        assert not any(p.name.startswith(".") and p.name != ".lock" for p in folder.iterdir()), label


def test_a_reader_finishes_a_committed_save_unless_a_trainer_holds_the_folder(tmp_path: Path) -> None:
    import fcntl

    folder = tmp_path / "run" / "checkpoints"
    old_folder(folder)
    killed_at(5, lambda: new_save(folder))  # after the journal: mid-publish
    assert (folder / JOURNAL).exists()
    held = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)  # a trainer of this folder is running: it finishes the save itself
    settle(folder)
    assert (folder / JOURNAL).exists()
    os.close(held)
    assert checkpoint_dir(tmp_path / "run") == folder  # what tfx.evaluate and tfx.average call first
    assert not (folder / JOURNAL).exists() and visible(folder)["last"] == b"new last"


def snapshot(ckpts: Path) -> dict[str, int]:
    """Each checkpoint's name and the update it holds."""
    return {p.name: load_checkpoint(p)["step"] for p in sorted(ckpts.glob("checkpoint_*.pt"))}


@pytest.mark.slow
def test_a_kill_at_every_step_of_a_trainers_save_leaves_a_set_the_uninterrupted_run_had(tmp_path: Path) -> None:
    """Epochs of 32 updates, validation and a numbered checkpoint at each end, keep_last 2: the save at the end
    of epoch 3 writes best (BLEU rises or not: whichever, the sets are compared), a numbered checkpoint, and
    prunes epoch 1's. Each kill leaves the set the uninterrupted run had after epoch 2's save or epoch 3's."""
    cfg = tiny_cfg(tmp_path, max_updates=0, max_epochs=3, save_every_epochs=1, keep_last=2, valid_max_sentences=4)
    sets: list[dict[str, int]] = []
    reference = tmp_path / "uninterrupted" / "checkpoints"
    transaction.STEP_HOOK = lambda label: label == "end" and sets.append(snapshot(reference))
    try:
        train(cfg, tmp_path / "uninterrupted")
    finally:
        transaction.STEP_HOOK = None
    assert len(sets) == 3 and sets[-1] == snapshot(reference)
    two_epochs = tmp_path / "two_epochs"
    train(tiny_cfg(tmp_path, max_updates=0, max_epochs=2, save_every_epochs=1, keep_last=2, valid_max_sentences=4),
          two_epochs)  # fmt: skip
    steps = labels_of(lambda: train(cfg, copy_of(two_epochs, tmp_path / "probe")))
    assert "journal" in steps and any(s.startswith("remove checkpoint_1_") for s in steps)
    for k, label in enumerate(steps):
        run = copy_of(two_epochs, tmp_path / f"kill{k}")
        killed_at(k, lambda run=run: train(cfg, run))
        assert snapshot(checkpoint_dir(run)) in (sets[1], sets[2]), label  # checkpoint_dir settles, as readers do
        train(cfg, run)  # resumed: the uninterrupted run's end
        assert snapshot(run / "checkpoints") == sets[2], label


def copy_of(run: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(run, to)
    return to

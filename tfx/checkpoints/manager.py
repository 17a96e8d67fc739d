"""A run's ``checkpoints/`` folder: lock, writability, stale temp files, saving, pruning and resume.

Only rank 0 writes. One trainer at a time holds ``checkpoints/.lock`` (``fcntl.flock``, released
by the kernel even after ``kill -9``), so nothing else can write into the folder while it cleans
up the temp files a killed save left behind. Resuming compares everything that defines the
training trajectory (``trajectory``) and refuses a run whose settings changed, unless
``train.resume_mode=force``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import logging
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hydra.experimental.callback import Callback

from tfx.checkpoints.load import (
    RESUME_KEYS,
    CheckpointError,
    UnreadableCheckpoint,
    load_checkpoint,
    weights_only_payload,
)
from tfx.checkpoints.numbered import NUMBERED, numbered_checkpoints
from tfx.checkpoints.transaction import SaveTransaction, recover
from tfx.files.environment import is_disk_full  # ENOSPC anywhere in the chain (torch.save's 'unexpected pos')

log = logging.getLogger("tfx.train")

LAST, BEST = "checkpoint_last.pt", "checkpoint_best.pt"
# Data settings that change where or how fast data is read, not what is read.
DATA_NOT_TRAJECTORY = ("cache_dir", "num_workers", "hub_cache_dir", "hub_timeout")
# a default that fills optim.warmup_updates (recorded itself) for the methods that warm up: changing an
# experiment's default must not refuse the resume of a run whose warmup it did not change
OPTIM_NOT_TRAJECTORY = ("budget_warmup",)


class RunFolderError(CheckpointError):
    """The run folder cannot be used: not writable, locked by another trainer, or the disk is full."""


# --------------------------------------------------------------------------- RNG, one entry per rank


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's generators: CPU, Python, and its own CUDA device (not every device)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore ``rng_state``; the tensors must be CPU ByteTensors (checkpoints load on the CPU)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


# ------------------------------------------------------------------------- resume compatibility


def _plain(value: Any) -> Any:
    """Lists and tuples compare equal whichever Hydra or torch.load produced."""
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in sorted(value.items())}
    return value


def trajectory(config: dict[str, Any], spm_model: bytes, vocab_size: int, world_size: int, optimizer: str) -> dict:
    """The settings that define where training goes, flattened to ``{name: value}``.

    ``config`` is ``dataclasses.asdict(Config)``; activation checkpointing (memory only) and
    where data is cached are left out, everything else about model, data and optimizer counts.
    """
    items: dict[str, Any] = {}
    for key, value in config["model"].items():
        if key != "checkpoint_activations":
            items[f"model.{key}"] = value
    for key, value in config["data"].items():
        if key not in DATA_NOT_TRAJECTORY:
            items[f"data.{key}"] = value
    for key, value in config["optim"].items():
        if key not in OPTIM_NOT_TRAJECTORY:
            items[f"optim.{key}"] = value
    items["optimizer"] = optimizer
    items["train.seed"] = config["train"]["seed"]
    items["train.update_freq"] = config["train"]["update_freq"]
    items["world size"] = world_size
    items["vocab size"] = vocab_size
    items["sentencepiece model"] = "sha256:" + hashlib.sha256(spm_model).hexdigest()[:12]
    return {k: _plain(v) for k, v in items.items()}


def checkpoint_trajectory(ckpt: dict[str, Any]) -> dict[str, Any]:
    """``trajectory`` as recorded in a checkpoint (older ones lack world size and optimizer: 1, AdamW)."""
    world, optimizer = ckpt.get("world_size", 1), ckpt.get("optimizer_name", "AdamW")
    return trajectory(ckpt["config"], ckpt["spm_model"], ckpt["vocab_size"], world, optimizer)


def differences(saved: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """``name (saved -> ours)`` for every setting that changed. Settings a checkpoint does not record
    (written before the field existed) cannot be compared and are skipped."""
    return [f"{k} ({saved[k]!r} -> {ours.get(k)!r})" for k in saved if saved[k] != ours.get(k)]


# ----------------------------------------------------------------------------- the run folder


def check_writable(folder: Path, what: str) -> None:
    """Create ``folder`` and write a probe file there, so a read-only location fails before any work."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise RunFolderError(
            f"{what} {folder} is not writable ({err.strerror or err}): choose another run folder (hydra.run.dir=...)"
        ) from err


class WritableRunDir(Callback):
    """Hydra callback: refuse an unwritable run (or sweep) folder before Hydra writes its logs there.

    Hydra creates the folder and opens ``train.log`` before tfx code runs, so without this a
    read-only location ends in a Hydra traceback. Nothing is created here: the check probes the
    folder, or its nearest existing parent.
    """

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        self._check(Path(str(config.hydra.run.dir)), "hydra.run.dir")

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        self._check(Path(str(config.hydra.sweep.dir)), "hydra.sweep.dir")

    @staticmethod
    def _check(folder: Path, setting: str) -> None:
        probe = folder
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            check_writable(probe, "folder")
        except RunFolderError as err:
            reason = err.__cause__.strerror if isinstance(err.__cause__, OSError) else err
            log.error("%s=%s: %s is not writable (%s): choose another folder", setting, folder, probe, reason)
            raise SystemExit(1) from None


class CheckpointManager:
    """Rank 0's checkpoint folder; every method is a no-op (or a read) on other ranks."""

    def __init__(self, run_dir: Path, keep_last: int, rank: int = 0) -> None:
        self.run_dir = run_dir
        self.dir = run_dir / "checkpoints"
        self.keep_last = keep_last
        self.rank = rank
        self.is_main = rank == 0
        self.last_saved_step: int | None = None  # update held by checkpoint_last.pt, once known
        self._lock_fd: int | None = None

    # ---------------------------------------------------------------------- start and end
    def open(self, held_lock: int | None = None) -> None:
        """Check the folders are writable, take the lock (or adopt ``held_lock``, the fd of ``checkpoints/.lock``
        already locked: ``tfx.checkpoints.unfinished``), remove temp files of killed saves."""
        if not self.is_main:
            return
        check_writable(self.run_dir, "run folder")
        check_writable(self.dir, "checkpoint folder")
        self._lock(held_lock)
        self._remove_stale_temp_files()

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def _lock(self, held: int | None = None) -> None:
        fd = held if held is not None else os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a no-op on a lock this fd holds
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunFolderError(
                f"run folder {self.run_dir} is in use by another trainer (pid {holder}): "
                "wait for it to finish, or use another hydra.run.dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _remove_stale_temp_files(self) -> None:
        """Finish a save a kill interrupted after its commit (``tfx.checkpoints.transaction``), then remove the
        temp files of saves killed before it (``.<name>.<random>.tmp``); under the lock none is live."""
        finished, removed = recover(self.dir)
        if finished:
            log.info("finished the save an interrupted run had committed in %s", self.dir)
        for tmp, size in removed:
            log.info("removed %s (%.1f MB), left by an interrupted save", tmp, size / 2**20)

    # ----------------------------------------------------------------------------- resume
    def resume_path(self, setting: str | None) -> Path | None:
        """``train.resume``: a checkpoint's path (it must exist); ``auto`` the run's checkpoint_last.pt if present;
        ``never`` nothing, and a folder that already holds a run is refused (its checkpoints would be overwritten)."""
        last = self.dir / LAST
        if setting == "never":
            if last.exists():
                raise CheckpointError(
                    f"train.resume=never, but {self.run_dir} already holds a run ({last}): choose another "
                    "hydra.run.dir, or leave train.resume=auto to go on with it"
                )
            return None
        explicit = setting not in (None, "auto")
        path = Path(setting) if explicit else last
        if path.exists():
            return path
        if explicit:
            raise CheckpointError(f"train.resume={path} does not exist")
        return None

    def resume(
        self,
        explicit: str | None,
        ours: dict[str, Any],
        force: bool,
        load_states: Callable[[dict[str, Any], dict[str, Any]], None],
        device: torch.device,
        mmap: bool = False,
        weights_only: bool = False,
    ) -> tuple[Path, dict[str, Any]] | None:
        """Load weights, optimizer moments and this rank's RNG streams from the checkpoint to resume
        from, if any; returns its path and the checkpoint (``train_state``, ``scaler``).

        ``load_states(model_state, optimizer_state)`` puts the weights in place (``tfx.runtime.sharding``);
        ``mmap``: tensors are read from the file as they are used (FSDP ranks other than 0 read none).
        ``weights_only`` (``train.resume_mode=weights``): the weights and the update count only, from
        any checkpoint of the run; see ``weights_train_state``.
        """
        path = self.resume_path(explicit)
        if path is None:
            return None
        try:
            ckpt = self.load_for_resume(path, ours, force, mmap, weights_only)
        except UnreadableCheckpoint as err:
            raise CheckpointError(f"{err}; {self.fallback_advice(path)}") from err
        try:
            load_states(ckpt["model"], None if weights_only else ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError) as err:
            first = str(err).strip().splitlines()[0]
            raise CheckpointError(f"cannot resume from {path}: its weights do not fit this model ({first})") from err
        if weights_only:
            return path, {**ckpt, "train_state": weights_train_state(ckpt)}
        rngs = ckpt["rng"] if isinstance(ckpt["rng"], list) else [ckpt["rng"]]  # one entry per rank
        if self.rank < len(rngs):
            set_rng_state(rngs[self.rank], device)
        return path, ckpt

    def load_for_resume(
        self, path: Path, ours: dict[str, Any], force: bool, mmap: bool = False, weights_only: bool = False
    ) -> dict[str, Any]:
        """The checkpoint on the CPU (RNG states must stay CPU tensors), checked against ``ours``."""
        ckpt = load_checkpoint(path, map_location="cpu", mmap=mmap)
        if not weights_only and any(k not in ckpt for k in RESUME_KEYS):
            raise CheckpointError(
                f"cannot resume from {path}: it holds weights only (best, numbered and averaged checkpoints do); "
                "resume from the run's checkpoint_last.pt, or from these weights with train.resume_mode=weights"
            )
        changed = differences(checkpoint_trajectory(ckpt), ours)
        if changed and not force:
            raise CheckpointError(
                f"cannot resume from {path}: settings differ from the checkpoint: {'; '.join(changed)}. "
                "Use a new run folder (hydra.run.dir=...), the same settings, or train.resume_mode=force"
            )
        if changed:
            log.warning("train.resume_mode=force: resuming %s with changed settings: %s", path, "; ".join(changed))
        self.last_saved_step = ckpt["step"] if path == self.dir / LAST and not weights_only else None
        if weights_only:
            log.warning(
                "train.resume_mode=weights: resuming from the weights of %s at update %d; the optimizer's moments, "
                "the RNG streams and the training-minute clock start afresh, and epoch %d from its first batch",
                path, ckpt["step"], ckpt["epoch"],
            )  # fmt: skip
        return ckpt

    def fallback_advice(self, damaged: Path) -> str:
        """What to do when ``damaged`` cannot be read: the newest readable checkpoint of its folder, if any.

        Nothing is written here: the damaged file stays as it is until the user decides.
        """
        newest: tuple[int, Path, dict[str, Any]] | None = None
        for candidate in [damaged.parent / LAST, damaged.parent / BEST, *damaged.parent.glob("checkpoint_*_*.pt")]:
            if candidate == damaged or not candidate.is_file():
                continue
            try:
                ckpt = load_checkpoint(candidate, mmap=True)
            except CheckpointError:
                continue
            if newest is None or ckpt["step"] > newest[0]:
                newest = (ckpt["step"], candidate, ckpt)
        if newest is None:
            return f"no other checkpoint in {damaged.parent} can be read: start a new run folder (hydra.run.dir=...)"
        step, path, ckpt = newest
        full = all(k in ckpt for k in RESUME_KEYS)
        means = "a full checkpoint" if full else "weights only: the optimizer's moments and RNG streams restart"
        setting = f"train.resume={path.resolve()}" + ("" if full else " train.resume_mode=weights")
        return (
            f"the newest readable checkpoint is {path} (update {step}, epoch {ckpt['epoch']}; {means}): "
            f"to go on from it, run again with {setting}; {damaged.name} is left as it is"
        )

    # ------------------------------------------------------------------------------ saving
    def save(
        self, payload: dict[str, Any], write_last: bool, best: bool, numbered_epoch: int | None,
        whole_epoch: bool = False,
    ) -> None:  # fmt: skip
        """checkpoint_last.pt (full payload) and weights-only best/numbered copies, as one transaction
        (``tfx.checkpoints.transaction``): a kill at any point leaves this save's files or the previous save's.

        ``whole_epoch``: the numbered checkpoint closes its epoch, so it replaces (after it is written) the
        numbered checkpoints of the same epoch that a stop wrote mid-epoch: an interrupted and resumed run
        keeps one numbered checkpoint per epoch, and ``--avg N`` averages N epochs, as without the stop.
        A failure from a full disk becomes one line naming the file and the last good checkpoint; the staged
        files are removed and the previous ones left intact.
        """
        if not self.is_main:
            return
        step = payload["step"]
        numbered = f"checkpoint_{numbered_epoch}_{step}.pt" if numbered_epoch is not None else None
        copies = ([BEST] if best else []) + ([numbered] if numbered else [])
        tx, writing = SaveTransaction(self.dir), self.dir / LAST
        try:
            if copies:
                writing = self.dir / copies[0]
                with tx.stage(copies[0]) as f:
                    torch.save(weights_only_payload(payload), f)
                for other in copies[1:]:
                    writing = self.dir / other
                    tx.copy(copies[0], other)
            if write_last:
                writing = self.dir / LAST
                with tx.stage(LAST) as f:
                    torch.save(payload, f)
            for old in self._superseded(numbered, numbered_epoch, step, whole_epoch):
                tx.remove(old)
            writing = self.dir
            tx.commit()
        except (OSError, RuntimeError) as err:
            tx.abort()
            if not is_disk_full(err):
                raise
            raise RunFolderError(f"no space left on device writing {writing}; {self.last_good()}") from err
        if write_last:
            self.last_saved_step = step

    def _superseded(self, numbered: str | None, epoch: int | None, step: int, whole_epoch: bool) -> list[str]:
        """The numbered checkpoints this save removes: with ``whole_epoch``, those a stop wrote earlier in the same
        epoch; then all but the newest ``keep_last`` (a user's ``checkpoint_avg_last5.pt`` is not numbered, so it is
        neither parsed nor removed)."""
        if numbered is None:
            return []
        found = {p.name: NUMBERED.match(p.name) for p in numbered_checkpoints(self.dir)}
        partial = [n for n, m in found.items() if whole_epoch and int(m[1]) == epoch and int(m[2]) < step]
        kept = {n: (int(m[2]), int(m[1])) for n, m in found.items() if n not in partial} | {numbered: (step, epoch)}
        pruned = sorted(kept, key=kept.__getitem__)[: -self.keep_last]
        return partial + [name for name in pruned if name != numbered]

    def has_numbered(self, step: int) -> bool:
        """Whether a numbered checkpoint of update ``step`` exists (the run's end need not write another)."""
        found = self.dir.iterdir() if self.dir.is_dir() else ()
        return any(int(m[2]) == step for p in found if (m := NUMBERED.match(p.name)))

    def last_good(self) -> str:
        if self.last_saved_step is None:
            return "no checkpoint was written yet"
        return f"the last good checkpoint is {self.dir / LAST} (update {self.last_saved_step})"


def weights_train_state(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A ``TrainState`` for a resume from weights alone: the update count (so the lr schedule and
    ``max_updates`` go on), the epoch (begun again from its first batch; a numbered checkpoint is
    written after its epoch ended, so the next one begins) and the best BLEU so far."""
    return {"step": ckpt["step"], "epoch": ckpt["epoch"], "best_bleu": ckpt.get("metrics", {}).get("best_bleu", -1.0)}


def our_trajectory(cfg: Any, tokenizer: Any, world_size: int, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``trajectory`` of a run about to start."""
    config = dataclasses.asdict(cfg)
    return trajectory(config, tokenizer.model_bytes, tokenizer.vocab_size, world_size, type(optimizer).__name__)

"""Which earlier run a re-run of the same command resumes (``train.resume=auto``), as a fairseq user expects.

Hydra gives every run a new time-stamped folder (``outputs/<experiment>/<method>/<time>``), so re-running a
command after a stop, a crash, a pre-emption or a SLURM requeue used to start again at update 0 beside the run it
meant to continue. Now the command line's run (not one given ``hydra.run.dir``, not a sweep point) first looks at
its sibling folders for the newest run of the same settings that did not finish and resumes that one:

- *did not finish*: it has ``checkpoints/checkpoint_last.pt`` and its ``metrics.jsonl`` does not end with
  ``completed``, ``early stop`` or ``diverged`` (a signal's stop, or no end record at all: a crash or SIGKILL);
- *the same settings*: the resolved config of its ``.hydra/config.yaml`` equals this run's, except the knobs
  that may change between a run and its resumption (``SAFE_TO_CHANGE``: budgets, threads, device, logging, where
  data is cached); a run whose settings differ is left alone, and the log says which setting kept it so;
- *not in use*: its ``checkpoints/.lock`` is free. The lock is taken here and handed to the run's
  ``CheckpointManager``, so two identical commands started together never resume the same folder.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfx.checkpoints.manager import DATA_NOT_TRAJECTORY, LAST
from tfx.config import Config

FINISHED = ("completed", "early stop", "diverged")
# settings a resumed run may change: how long it trains and on what, how it logs and keeps checkpoints, where its
# data is cached; everything else (model, data, optimizer, init, seed, update_freq, validation) must be equal
SAFE_TO_CHANGE = {
    "train": (
        "max_updates", "max_epochs", "max_minutes", "patience", "threads", "device", "progress", "log_every_updates",
        "layer_stats_every_updates", "keep_last", "resume", "resume_mode", "stop_signals", "compile", "compile_scope",
    ),
    "data": DATA_NOT_TRAJECTORY,
}  # fmt: skip


@dataclass
class Unfinished:
    """A run to resume, with its lock held (``held_lock``, for ``CheckpointManager.open``)."""

    folder: Path
    status: str  # its metrics.jsonl's last word: "stopped by SIGTERM", or "no end record" after a crash
    held_lock: int


def comparable(config: dict[str, Any]) -> dict[str, Any]:
    """``dataclasses.asdict(Config)`` without ``SAFE_TO_CHANGE``, flattened to ``{section.key: value}``."""
    flat = {}
    for section, values in config.items():
        if not isinstance(values, dict):
            flat[section] = values
            continue
        for key, value in values.items():
            if key not in SAFE_TO_CHANGE.get(section, ()):
                flat[f"{section}.{key}"] = value
    return flat


def setting_changes(theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """``name (theirs -> ours)`` for each setting that differs."""
    return [f"{k} ({theirs.get(k)!r} -> {ours.get(k)!r})" for k in sorted(set(theirs) | set(ours)) if
            theirs.get(k) != ours.get(k)]  # fmt: skip


def end_status(run: Path) -> str | None:
    """The status of ``metrics.jsonl``'s end record, "no end record" when it has none, None without the file."""
    path = run / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            tail = f.read().decode("utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(tail):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by SIGKILL
        return str(record.get("status", "")) if record.get("event") == "end" else "no end record"
    return "no end record"


def saved_config(run: Path) -> dict[str, Any] | None:
    """The resolved config a run was started with (``.hydra/config.yaml``), or None when it cannot be read."""
    from omegaconf import OmegaConf

    from tfx.config import to_config

    try:  # typed against the schema, as Hydra composed it (interpolations such as the tuned rows resolve here)
        saved = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(run / ".hydra" / "config.yaml"))
        return dataclasses.asdict(to_config(saved))
    except Exception:  # noqa: BLE001 - any unreadable or outdated config is "not the same settings"
        return None


def try_lock(run: Path) -> int | None:
    """The run's checkpoint lock, taken (its fd), or None when another trainer holds it."""
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    fd = os.open(run / "checkpoints" / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def find_unfinished(run_dir: Path, cfg: Config) -> tuple[Unfinished | None, str | None]:
    """The newest sibling of ``run_dir`` with this run's settings, locked, when it did not finish; else None and,
    when an unfinished run of other settings was passed over, one line saying which and why. A finished newest
    run, or one in use (the same command started twice at once), means a new run."""
    ours = comparable(dataclasses.asdict(cfg))
    candidates = [p for p in run_dir.parent.iterdir() if p != run_dir and (p / "checkpoints" / LAST).is_file()]
    candidates.sort(key=lambda p: (p / "checkpoints" / LAST).stat().st_mtime, reverse=True)
    passed_over = None
    for folder in candidates:
        status = end_status(folder)
        unfinished = status is not None and not status.startswith(FINISHED)
        theirs = saved_config(folder)
        if theirs is None or (changes := setting_changes(comparable(theirs), ours)):
            if unfinished and passed_over is None:
                why = "its settings cannot be read" if theirs is None else f"settings differ: {'; '.join(changes[:4])}"
                passed_over = f"not resuming the unfinished run {folder} ({why}): starting a new run"
            continue
        fd = try_lock(folder) if unfinished else None
        return (Unfinished(folder, status, fd), None) if fd is not None else (None, None)
    return None, passed_over

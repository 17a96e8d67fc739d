"""Checkpoints: atomic writes, ``weights_only`` loads, and rebuilding a model from one.

A checkpoint is a plain dict (loadable with ``torch.load(..., weights_only=True)``):

``model``        model state_dict
``optimizer``    optimizer state_dict (training checkpoints only)
``scheduler``    LR-scheduler state_dict
``step``         updates done; ``epoch`` current epoch; ``batch_in_epoch`` iterator position
``rng``          CPU/CUDA/python RNG states (resume reproduces an uninterrupted run)
``config``       the resolved run config as a plain dict
``spm_model``    the sentencepiece model proto (bytes): translation needs no training data
``vocab_size``   the model's vocabulary size, checked against ``spm_model``
``metrics``      e.g. best validation BLEU so far
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch


@functools.cache
def git_sha() -> str | None:
    """tfx's commit, recorded in checkpoints and scores (None outside a git checkout); asked once per process."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or inconsistent (message is one line for the user)."""


def atomic_save(obj: Any, path: str | Path) -> None:
    """Write to a temp file in the same folder, fsync, then rename over ``path``.

    A crash or SIGKILL mid-write leaves the previous good file untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load with ``weights_only=True``; a missing or corrupt file is a one-line ``CheckpointError``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist: pass a .pt file written by tfx.train")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same thing to the user
        raise CheckpointError(f"checkpoint {path} is unreadable ({type(e).__name__}): is it a tfx checkpoint?") from e
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        raise CheckpointError(f"checkpoint {path} has no 'model'/'config' entries: not a tfx checkpoint")
    return ckpt


def build_from_checkpoint(ckpt: dict[str, Any], device: str | torch.device = "cpu"):
    """(model in eval mode, tokenizer, config dict) from a loaded checkpoint."""
    from tfx.config import ModelConfig
    from tfx.data import PAD, Tokenizer, check_vocab
    from tfx.model import build_model

    tokenizer = Tokenizer.from_bytes(ckpt["spm_model"])
    check_vocab(tokenizer, ckpt["vocab_size"], "checkpoint")
    model_cfg = ModelConfig(**ckpt["config"]["model"])
    model = build_model(model_cfg, ckpt["vocab_size"], PAD)
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), tokenizer, ckpt["config"]


def atomic_copy(src: str | Path, dst: str | Path) -> None:
    """Copy a finished checkpoint under another name without ever exposing a partial file."""
    import shutil

    dst = Path(dst)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

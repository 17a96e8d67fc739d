"""Checkpoints: ``weights_only`` loads and rebuilding a model from one (writes: ``tfx.files.atomic``).

A checkpoint is a plain dict (loadable with ``torch.load(..., weights_only=True)``):

``model``        model state_dict
``step``         updates done; ``epoch`` current epoch
``config``       the resolved run config as a plain dict
``spm_model``    the sentencepiece model proto (bytes): translation needs no training data
``vocab_size``   the model's vocabulary size, checked against ``spm_model``
``metrics``      e.g. best validation BLEU so far
``git_sha``      tfx's commit

and, in ``checkpoint_last.pt`` only (the one a run resumes from; see ``RESUME_KEYS``):

``optimizer``    optimizer state_dict
``train_state``  step, epoch, iterator position, timers (``tfx.train.TrainState``)
``rng``          per-rank CPU/CUDA/python RNG states (resume reproduces an uninterrupted run)
``scaler``       the fp16 loss scaler's state (``tfx.runtime.precision``)
``world_size``   ranks that trained it (resume refuses another)
"""

from __future__ import annotations

import functools
import re
import subprocess
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


RESUME_KEYS = ("optimizer", "train_state", "rng")  # what only a resumable checkpoint needs
OPTIONAL_RESUME_KEYS = ("scaler",)  # resume state that older checkpoints may lack


def weights_only_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` without the resume state: enough to translate, evaluate and average."""
    return {k: v for k, v in payload.items() if k not in RESUME_KEYS + OPTIONAL_RESUME_KEYS}


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or inconsistent (message is one line for the user)."""


class UnreadableCheckpoint(CheckpointError):
    """``torch.load`` failed on the file: cut short (an interrupted copy), damaged, or not a checkpoint."""


class MissingPlugin(CheckpointError):
    """A module in the checkpoint's ``plugins`` (its residual kind or init scheme) does not import here: the
    checkpoint is fine, the Python path is not."""


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict[str, Any]:
    """Load with ``weights_only=True``; a missing or corrupt file is a one-line ``CheckpointError``.

    ``mmap``: tensors stay in the file (page cache, shared by the ranks of a node) until read.
    """
    path = Path(path)
    if path.is_dir():
        held = sorted(p.relative_to(path).as_posix() for p in [*path.glob("*.pt"), *path.glob("checkpoints/*.pt")])
        holds = f"it holds {', '.join(held)}" if held else "it holds no .pt checkpoint files"
        raise CheckpointError(f"checkpoint {path} is a folder; {holds}: pass one checkpoint file")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist: pass a .pt file written by tfx.train")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same thing to the user
        raise UnreadableCheckpoint(
            f"checkpoint {path} is unreadable ({_why_unreadable(e)}): it is truncated, corrupt or not a checkpoint"
        ) from e
    if not isinstance(ckpt, dict) or "model" not in ckpt or "config" not in ckpt:
        raise CheckpointError(f"checkpoint {path} has no 'model'/'config' entries: not a tfx checkpoint")
    return ckpt


def _why_unreadable(err: Exception) -> str:
    """``torch.load``'s failure in a few words: its first sentence without terminal colours, not its paragraph of
    advice on ``weights_only=False`` (tfx never unpickles code from a file)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()
    if text.startswith("Weights only load failed"):
        unsupported = re.search(r"Unsupported global: GLOBAL (\S+)", text)
        if unsupported:  # a pickle of other objects than tensors and plain values: not written by tfx
            return f"it holds a {unsupported[1]} object, which a weights-only load refuses"
        return "not a pickle of tensors that a weights-only load reads"
    first = re.split(r"(?<=\.)\s", (text.splitlines() or [""])[0])[0]
    return f"{type(err).__name__}: {first if len(first) <= 120 else first[:117].rsplit(' ', 1)[0] + ' ...'}"


def build_from_checkpoint(ckpt: dict[str, Any], device: str | torch.device = "cpu"):
    """(model in eval mode, tokenizer, config dict) from a loaded checkpoint."""
    from tfx.config import import_plugins
    from tfx.data import PAD, Tokenizer, check_vocab
    from tfx.model import build_model

    tokenizer = Tokenizer.from_bytes(ckpt["spm_model"])
    check_vocab(tokenizer, ckpt["vocab_size"], "checkpoint")
    try:
        import_plugins(ckpt["config"].get("plugins"))  # a residual kind from outside tfx
    except ValueError as err:
        raise MissingPlugin(f"its model needs a plugin that does not import here: {err}") from None
    # a dict of ModelConfig's fields; one written before a field existed rebuilds with its default, as then
    model = build_model(ckpt["config"]["model"], ckpt["vocab_size"], PAD)
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), tokenizer, ckpt["config"]

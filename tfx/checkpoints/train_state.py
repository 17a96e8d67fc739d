"""What a run's checkpoint_last.pt restores: the loop's counters (``TrainState``) and the whole payload.

The weights and optimizer moments come from ``tfx.runtime.sharding.state_dicts`` (gathered on rank 0 under
FSDP); this file says what else a checkpoint of a run holds, so that resume continues the same
trajectory (``tfx.checkpoints.manager`` checks it) and evaluation can rebuild the model and tokenizer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tfx.checkpoints.load import git_sha
from tfx.config import Config, TrainConfig
from tfx.data import Tokenizer
from tfx.runtime import sharding
from tfx.runtime.precision import Precision, StepOutcome


class TrainingDiverged(RuntimeError):
    """Too many consecutive non-finite steps (message names the step and the last good checkpoint)."""


@dataclass
class TrainState:
    """Everything besides weights and optimizer moments that resume needs."""

    step: int = 0  # updates applied
    epoch: int = 1  # current epoch (1-based)
    batch_in_epoch: int = 0  # index of this rank's next batch in the current epoch
    train_seconds: float = 0.0  # wall time spent in training steps (validation excluded)
    best_bleu: float = -1.0
    best_step: int = -1  # the update of the best valid BLEU (checkpoint_best.pt's); -1 before any validation
    best_loss: float = math.inf  # the lowest valid loss (bits/token) so far: what train.patience_metric=loss waits on
    bad_steps: int = 0  # consecutive non-finite steps
    skipped_steps: int = 0  # all non-finite steps so far
    overflow_steps: int = 0  # fp16 updates skipped by the loss scaler (not divergence; not in bad_steps)
    stale_validations: int = 0  # validations in a row since train.patience_metric last improved (train.patience)
    # the update of the latest validation: a resumed run must not validate again at it (a duplicate record,
    # and one more stale validation towards patience)
    validated_step: int = -1

    def record(self, outcome: StepOutcome) -> None:
        """Count an applied update, an fp16 overflow (the scaler's business) or a non-finite step."""
        if outcome.applied:
            self.step += 1
            self.bad_steps = 0
        elif outcome.overflow:
            self.overflow_steps += 1
        else:
            self.bad_steps += 1
            self.skipped_steps += 1

    def count_patience(self, bleu_improved: bool, loss: float, metric: str) -> None:
        """One validation towards ``train.patience``: reset the count when ``metric`` improved, else add one.

        ``loss`` improves only when strictly lower, as in fairseq's ``should_stop_early``.
        """
        loss_improved = loss < self.best_loss
        self.best_loss = min(self.best_loss, loss)
        improved = loss_improved if metric == "loss" else bleu_improved
        self.stale_validations = 0 if improved else self.stale_validations + 1

    def budget_left(self, t: TrainConfig) -> bool:
        """Whether max_updates, max_epochs and max_minutes (0 = unlimited) all leave room."""
        if t.max_updates and self.step >= t.max_updates:
            return False
        if t.max_epochs and self.epoch > t.max_epochs:
            return False
        if t.patience and self.stale_validations >= t.patience:
            return False
        return not (t.max_minutes and self.train_seconds >= 60 * t.max_minutes)

    def check_finite(self, max_bad_steps: int, last_good: Callable[[], str]) -> None:
        """Stop a run that only makes non-finite steps; ``last_good()`` says which checkpoint to go back to."""
        if self.bad_steps >= max_bad_steps:
            raise TrainingDiverged(
                f"{self.bad_steps} consecutive non-finite steps at update {self.step} "
                f"(epoch {self.epoch}); {last_good()}. Lower optim.lr or set optim.clip_norm."
            )

    def end_status(self, t: TrainConfig) -> str:
        """How a run that no signal stopped ended, for ``metrics.jsonl`` and the log."""
        if t.patience and self.stale_validations >= t.patience:
            if t.patience_metric == "loss":
                return f"early stop: no lower valid loss in {t.patience} validations (best {self.best_loss:.3f})"
            return f"early stop: no better valid BLEU in {t.patience} validations (best {self.best_bleu:.2f})"
        return "completed"

    def summary(self) -> dict[str, Any]:
        """What ``train()`` returns about where the run ended."""
        return {
            "best_bleu": self.best_bleu,
            "step": self.step,
            "epoch": self.epoch,
            "train_seconds": self.train_seconds,
        }


def checkpoint_payload(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState, precision: Precision, cfg: Config,
    tokenizer: Tokenizer, world_size: int, rngs: list[dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    """checkpoint_last.pt's contents (``CheckpointManager.save`` strips best/numbered copies to the weights)."""
    model_state, optim_state = sharding.state_dicts(model, optimizer)  # FSDP: gathered on rank 0
    return {
        "model": model_state,
        "optimizer": optim_state,
        "optimizer_name": type(optimizer).__name__,
        "train_state": dataclasses.asdict(state),
        "step": state.step,
        "epoch": state.epoch,
        "rng": rngs,
        "scaler": precision.state_dict(),
        "world_size": world_size,
        "config": dataclasses.asdict(cfg),
        "spm_model": tokenizer.model_bytes,
        "vocab_size": tokenizer.vocab_size,
        "metrics": {"best_bleu": state.best_bleu},
        "git_sha": git_sha(),
    }

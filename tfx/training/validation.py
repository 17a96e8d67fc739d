"""Validation during training: when it is due (every N updates, every M minutes of training time, each
epoch's end) and what one does to the run's state (best BLEU, patience), on every rank alike."""

from __future__ import annotations

import math

import torch
from torch import nn

from tfx.checkpoints.train_state import TrainState
from tfx.config import Config
from tfx.data import Corpus
from tfx.evaluation.validate import validate_on_main
from tfx.reporting.reporter import Reporter
from tfx.runtime import compilation, distributed
from tfx.runtime.stop import StopRequested


class Validator:
    """Valid BLEU on rank 0 (autocast for bf16 only), its result broadcast so every rank keeps the same state."""

    def __init__(
        self, model: nn.Module, corpus: Corpus, cfg: Config, device: torch.device, bf16: bool, is_main: bool,
        state: TrainState, report: Reporter,
    ) -> None:  # fmt: skip
        self.model, self.corpus, self.cfg, self.device = model, corpus, cfg, device
        self.bf16, self.is_main, self.state, self.report = bf16, is_main, state, report
        self._clock_start = state.train_seconds  # training time at the last scheduled validation

    def due(self, step: int) -> bool:
        """Whether update ``step`` validates on the schedule (epoch ends validate regardless)."""
        t = self.cfg.train
        minutes_due = t.validate_every_minutes and (
            self.state.train_seconds - self._clock_start >= 60 * t.validate_every_minutes
        )
        return bool(t.validate_every_updates) and step % t.validate_every_updates == 0 or bool(minutes_due)

    def scheduled(self) -> bool:
        """A validation ``due`` asked for: the minutes count again from here. True when BLEU improved."""
        self._clock_start = self.state.train_seconds
        return self.validate()

    def validate(self) -> bool:
        """Validate unless this update already was (a resumed run must not count it twice); True when BLEU
        improved. A stop signal inside it (rank 0 checks once per batch) raises ``StopRequested`` on every rank
        with the state as before, so the update is saved unvalidated and validated again on resume."""
        state = self.state
        if state.validated_step == state.step:
            return False
        result, stopped = None, None
        with compilation.eager():
            try:
                result = validate_on_main(self.model, self.corpus, self.cfg, self.device, self.bf16, self.is_main)
            except StopRequested as request:
                stopped = request.signal_name
        improved, loss = False, math.inf
        if result is not None:
            improved = result.bleu > self.state.best_bleu
            loss = result.metrics["valid/loss"]
        # Every rank keeps the same state (save decides from it), learns whether this was the best, and whether
        # rank 0 stopped (the others wait here, so they stop with it).
        improved, loss, result, stopped = distributed.broadcast_object((improved, loss, result, stopped))
        if stopped is not None:
            raise StopRequested(stopped)
        state.validated_step = state.step
        if result is not None:
            state.best_bleu = max(state.best_bleu, result.bleu)
            state.best_step = state.step if improved else state.best_step
            if self.is_main:
                self.report.valid(state.step, result, state.best_bleu, state.train_seconds / 60)
        state.count_patience(improved, loss, self.cfg.train.patience_metric)
        self.report.restart_window()  # validation time is not training throughput
        return improved

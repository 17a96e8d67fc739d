"""``Trainer``: build a run (data -> model -> init -> optimizer), resume it, then the loop of updates.

The loop queues each update on the device (``tfx.training.pending``) and reads the queue only when
``Schedule.due`` (``tfx.training.schedule``) says something acts at that update: logging, layer
statistics, the probe, a hook, validation, a numbered save, a registered action, or the stop.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from tfx.checkpoints.manager import CheckpointManager
from tfx.checkpoints.train_state import TrainingDiverged
from tfx.config import Config
from tfx.data import Batch
from tfx.data.plan import TrainBatches
from tfx.optim.optimizers import lr_at
from tfx.reporting.logger import Budget, Progress
from tfx.reporting.reporter import Reporter
from tfx.runtime import compilation, distributed
from tfx.runtime.stop import StopRequested, StopSignal
from tfx.training import build
from tfx.training.checkpointing import Checkpointer
from tfx.training.launch import Launch
from tfx.training.pending import PendingUpdates
from tfx.training.prefetch import Prefetcher
from tfx.training.resume import resume_state
from tfx.training.schedule import PeriodicAction, loop_schedule
from tfx.training.step import Pending, Stepper, account
from tfx.training.validation import Validator

UpdateHook = Callable[["Trainer", dict[str, float]], None]

__all__ = ["Launch", "StopSignal", "Trainer", "UpdateHook", "train"]


class Trainer:
    """One run: build (data -> model -> init -> optimizer), resume, then ``run`` the loop.

    What builds the parts is ``tfx.training.build``; where the numbers go is ``self.report``'s job
    (``tfx.reporting.reporter``); the run folder's checkpoints are ``self.ckpts``'s, when and what to save
    ``self.checkpointer``'s; when anything is due is ``self.schedule``'s. ``actions``: periodic actions of the
    caller's (``schedule.Action``).
    """

    def __init__(
        self, cfg: Config, run_dir: Path, on_update: UpdateHook | None = None, actions: Sequence[PeriodicAction] = (),
        launch: Launch | None = None,
    ) -> None:  # fmt: skip
        self.cfg = cfg
        self.on_update = on_update  # called after every update (studies measure things here)
        self.dist, self.device = distributed.setup(cfg.train.device)  # a missing device fails here
        if not self.dist.is_main:
            logging.getLogger("tfx").setLevel(logging.WARNING)  # rank 0 alone reports progress
        self.run_dir = Path(distributed.broadcast_object(str(run_dir)))
        self.ckpts = CheckpointManager(self.run_dir, cfg.train.keep_last, self.dist.rank)
        self.launch = launch or Launch()  # a run of the command line's, or of a script's (None)
        self.ckpts.open(self.launch.held_lock)  # writable, locked and clean before any data preparation
        try:
            self._build(actions)
        except BaseException:
            self.ckpts.close()
            raise

    def _build(self, actions: Sequence[PeriodicAction]) -> None:
        cfg, t, dist, device = self.cfg, self.cfg.train, self.dist, self.device
        build.seed_everything(t)
        self.corpus = build.prepare_corpus(cfg, dist.is_main)
        self.batches = TrainBatches(self.corpus.splits["train"], cfg.data, t.seed, dist.rank, dist.world_size)
        fresh = self.ckpts.resume_path(t.resume) is None
        tokenizer = self.corpus.tokenizer
        self.model = build.initialized_model(cfg, tokenizer.vocab_size, fresh, self.batches.first_padded)
        build.reseed_dropout(t.seed, dist.rank)
        self.precision, self.optimizer = build.place_and_optimize(self.model, cfg, device)
        model, optimizer, precision = self.model, self.optimizer, self.precision
        self.state, self.resumed_from = resume_state(self.ckpts, cfg, tokenizer, dist.world_size, model, optimizer,
                                                     precision, device)  # fmt: skip
        self.net: nn.Module = self._wrap(model)
        self.stepper = Stepper(model, self.net, optimizer, precision, cfg.optim, device, dist.world_size)  # once
        self.report = Reporter(self.run_dir if dist.is_main else None, self.state.step, t.log_every_updates)
        self.probe = build.output_probe(self.model, self.corpus, t, self.state.step, device)
        budget = Budget(t.max_updates or None, t.max_epochs or None, 60 * t.max_minutes or None)
        self.progress = Progress(dist.is_main and t.progress, budget, self.state.step, t.log_every_updates)
        self.validator = Validator(model, self.corpus, cfg, device, precision.bf16, dist.is_main,
                                   self.state, self.report)  # fmt: skip
        self.checkpointer = Checkpointer(self.ckpts, model, optimizer, precision, cfg, tokenizer, dist.world_size,
                                         device, self.state)  # fmt: skip
        self.queue = PendingUpdates(self.state, t.log_every_updates)  # updates not read yet (tfx.training.step)
        self.schedule = loop_schedule(t, self.state, self.validator, self.checkpointer, self.probe is not None,
                                      self.on_update is not None, actions)  # fmt: skip
        self._epoch_batches = 0  # batches in the current epoch (the summary's fraction of an epoch)
        self._prefetch: Prefetcher[list[Batch]] = Prefetcher(enabled=device.type == "cuda")
        self.losses: list[float] = []  # per-update train loss of this process (tests compare these)

    def close(self) -> None:
        if hasattr(self, "report"):
            self.report.close()
            self._prefetch.close()
        self.ckpts.close()

    def _wrap(self, model: nn.Module) -> nn.Module:
        return build.wrap(model, self.cfg.train, self.dist, self.device, packed=self.batches.packed)

    def save(self, best: bool = False, numbered_epoch: int | None = None, whole_epoch: bool = False) -> None:
        """Read the queue (a checkpoint holds only counted updates), then save (``Checkpointer.save``)."""
        self._flush()
        self.checkpointer.save(best, numbered_epoch, whole_epoch)

    def train_step(self, batches: list[Batch], record_layers: bool = False) -> dict[str, float]:
        """One update over ``update_freq`` micro-batches, read at once into a flat metrics dict.

        The loop does not read each update: ``_update`` leaves it pending on the device (``tfx.training.step``).
        """
        self.queue.push(self._step(batches, record_layers))
        ((metrics, _applied),) = account(self.state, self.queue.read())
        return metrics

    def _step(self, batches: list[Batch], record_layers: bool) -> Pending:
        """One update, left on the device; its lr counts the unread updates as applied."""
        lr = lr_at(self.queue.step, self.cfg.optim)
        with compilation.eager() if record_layers else contextlib.nullcontext():  # the statistics hook layers
            return self.stepper.update(batches, lr, record_layers)

    def run(self) -> dict[str, Any]:
        """Epochs of updates until the budget is spent or a signal arrives; then validate and save."""
        n_params = sum(p.numel() for p in self.model.parameters())
        self.report.start(self.run_dir, self.cfg, n_params, self.device, self.precision.name, self.dist.world_size)
        started = time.perf_counter()
        signals = tuple(signal.Signals[name] for name in self.cfg.train.stop_signals)
        with StopSignal(signals) as stop:
            try:
                with self.progress.shown():  # a bar on a terminal, log lines above it
                    self._loop(stop)
            except StopRequested as request:  # inside validation (every rank raises it together)
                stop.request(request.signal_name)  # the state is the last completed update's: _finish saves it
            except TrainingDiverged:
                self.report.end(self.state.step, "diverged", self.state.train_seconds)
                raise
            return self._finish(stop, time.perf_counter() - started)

    def _loop(self, stop: StopSignal) -> None:
        """Epochs of updates, each validating and saving at its end, until a limit or a signal stops them."""
        self._catch_up()
        while not self._should_stop(stop):
            batches = self.batches.epoch(self.state.epoch)
            self._epoch_batches = len(batches)
            left = math.ceil((len(batches) - self.state.batch_in_epoch) / self.cfg.train.update_freq)
            per_epoch = math.ceil(len(batches) / self.cfg.train.update_freq)
            self.progress.epoch_planned(self.state.step + left - per_epoch, self.state.epoch, per_epoch)
            while self.state.batch_in_epoch < len(batches) and not self._should_stop(stop):
                self._update(batches)
                self._run_due()
            if self.state.batch_in_epoch >= len(batches):
                self._end_epoch()

    def _update(self, batches: list[Batch]) -> None:
        """Queue one update from the next ``update_freq`` batches; read the queue when anything is due."""
        start, step = self.state.batch_in_epoch, self.queue.step + 1  # this update's number, once applied
        pin, size = self.device.type == "cuda", self.cfg.train.update_freq
        make = functools.partial(self.batches.collate_group, batches, size=size, pin=pin)
        group = self._prefetch.get((self.state.epoch, start), lambda: make(start))
        tic = time.perf_counter()
        self.queue.push(self._step(group, self.schedule.due(step).layers))
        self.state.train_seconds += time.perf_counter() - tic
        self.state.batch_in_epoch = after = start + len(group)
        if after < len(batches):  # built while the device runs this update (GPU; inline on CPU)
            self._prefetch.prepare((self.state.epoch, after), lambda: make(after))
        if self.queue.full or self.schedule.due(step).read:
            self._flush()

    def _flush(self) -> None:
        """Read the queued updates (one sync), then count, log and hand each to the hook, in order."""
        for metrics, applied in account(self.state, self.queue.read()):
            self.losses.append(metrics["train/loss"])
            if applied and self.probe is not None and self.schedule.due(self.state.step).probe:
                with compilation.eager():
                    metrics.update(self.probe.measure(self.model))
            event = "update" if applied else "skipped"  # skipped: a non-finite step (or an fp16 overflow)
            self.report.update(event, self.state.step, self.state.epoch, metrics)
            self.state.check_finite(self.cfg.train.max_bad_steps, self.ckpts.last_good)
            if self.on_update is not None:
                self.on_update(self, metrics)
            layers = any(k.startswith("layers/") for k in metrics)
            self.report.scalars(self.state.step, self.state.epoch, metrics, force=layers)
            self.progress.update(self.state.step, self.state.epoch, metrics, self.state.train_seconds)

    def _run_due(self) -> None:
        """What is due at the counted update: validation and a numbered save (one write when both fall on it),
        then registered actions. Only once the queue is read: ``_update`` reads it whenever any is due."""
        if self.queue:
            return
        due = self.schedule.due(self.state.step)
        best = self.validator.scheduled() if due.validate else False
        if due.save or due.validate:
            self.save(best=best, numbered_epoch=self.state.epoch if due.save else None)
        for action in due.actions:
            action.run(self)

    def _catch_up(self) -> None:
        """A stop inside a scheduled validation saved its update with that validation (and the save and actions
        after it) undone: a resumed run does them first, as the uninterrupted run did at that update. (An epoch's
        end needs nothing here: its state is saved before the epoch counter moves, so the loop ends it again.)"""
        step = self.state.step
        if step and self.state.validated_step != step and self.schedule.due(step).validate:
            self._run_due()

    def _end_epoch(self) -> None:
        """Validate and save; a numbered checkpoint carries the epoch that just finished.

        The epoch counter moves only after validation, so a stop inside it saves the epoch as finished but not
        yet ended, and the resumed run validates and saves it as if it had never stopped."""
        self._flush()
        finished = self.state.epoch
        improved = self.validator.validate()
        self.state.epoch += 1
        self.state.batch_in_epoch = 0
        numbered = self.checkpointer.label_at_epoch_end(finished)
        # with numbered saves by epoch only, this one replaces what a stop wrote earlier in the same epoch
        self.save(improved, numbered, whole_epoch=not self.cfg.train.save_every_updates)

    def _should_stop(self, stop: StopSignal) -> bool:
        """Every rank must agree, or DDP would hang: stop if any rank wants to."""
        if stop.received is not None or self.schedule.due(self.queue.step).stop:
            self._flush()  # the exact count decides
        local = 1.0 if stop.received is not None or self.schedule.due(self.state.step).stop else 0.0
        return distributed.all_reduce_sum(local, self.device) > 0

    def _finish(self, stop: StopSignal, wall_seconds: float) -> dict[str, Any]:
        self._flush()
        self._agree_on_stop(stop)
        improved = False
        # a no-op when the last epoch end already validated (and saved) this update; a stop inside it leaves the
        # update unvalidated, and the resumed run (its budget spent) comes straight here to validate it again
        try:
            improved = stop.received is None and self.validator.validate()
        except StopRequested as request:
            stop.request(request.signal_name)
        self.save(best=improved, numbered_epoch=self.checkpointer.final_numbered_epoch())
        if stop.received is not None:
            self.report.stopped(stop.received, self.state.step, self.ckpts.dir / "checkpoint_last.pt",
                                self.launch.command)  # fmt: skip
        status = self.state.end_status(self.cfg.train) if stop.received is None else f"stopped by {stop.received}"
        self.report.end(self.state.step, status, self.state.train_seconds)
        self.report.final(self.cfg)
        self.report.summary(self.state, self._epochs_done(), wall_seconds, self.ckpts.dir, status)
        return {**self.state.summary(), "losses": self.losses, "stopped_by": stop.received}

    @staticmethod
    def _agree_on_stop(stop: StopSignal) -> None:
        """Every rank ends alike (the final validation and save are collectives): stopped by a signal if any rank
        received one, though the others did not (a signal sent to one process of the job)."""
        names = [name for name in distributed.gather_to_main(stop.received) if name is not None]
        received = distributed.broadcast_object(names[0] if names else None)
        if received is not None and stop.received is None:
            stop.request(received)

    def _epochs_done(self) -> float:
        """Epochs trained, with the fraction of the current one (a relaunched finished run trained no batch here,
        so the epoch's length comes from the data, not from this process's loop)."""
        batches = self._epoch_batches or len(self.batches.epoch(self.state.epoch))
        return self.state.epoch - 1 + self.state.batch_in_epoch / max(batches, 1)


def train(
    cfg: Config, run_dir: Path, on_update: UpdateHook | None = None, actions: Sequence[PeriodicAction] = (),
    launch: Launch | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Train one run into ``run_dir`` (resuming from its checkpoint_last.pt if present)."""
    trainer = None
    try:
        trainer = Trainer(cfg, run_dir, on_update, actions, launch)
        return trainer.run()
    finally:
        if trainer is not None:
            trainer.close()
        distributed.teardown()

"""``python -m tfx.train [+experiment=NAME] [key=value ...]``: the Hydra entry point and the loop.

Order: data -> model -> init -> optimizer (``tfx.build``). Adam without warmup (T-Fixup) or with it
(Post-LN baseline), label-smoothed cross-entropy, BLEU validation (``tfx.validate``), metrics.jsonl and
TensorBoard under ``<run>/tb`` (``tfx.reporter``), checkpoints under ``<run>/checkpoints``
(``tfx.run_checkpoints``; what they hold: ``tfx.train_state``). Runs as is on one device or under
``torchrun --nproc_per_node=K`` (DDP, or FSDP with ``train.strategy=fsdp``: ``tfx.sharding``; rank 0
alone logs and writes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from tfx import build, compilation, distributed, sharding
from tfx.checkpoint import CheckpointError
from tfx.config import CONF_DIR, Config, register_configs, to_config, unknown_key
from tfx.data import Batch, DataError
from tfx.data.plan import TrainBatches
from tfx.distributed import DeviceError
from tfx.logger import Budget, Progress
from tfx.optim import lr_at
from tfx.precision import PrecisionError
from tfx.prefetch import Prefetcher
from tfx.reporter import Reporter
from tfx.run_checkpoints import CheckpointManager, our_trajectory, rng_state
from tfx.sharding import ShardingError
from tfx.step import Pending, Stepper, account, read
from tfx.train_state import TrainingDiverged, TrainState, checkpoint_payload
from tfx.validate import validate_on_main

log = logging.getLogger("tfx.train")


UpdateHook = Callable[["Trainer", dict[str, float]], None]


class StopSignal:
    """SIGTERM/SIGINT: finish the current step, write checkpoint_last.pt, exit cleanly."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signal.Signals(signum).name


class Trainer:
    """One run: build (data -> model -> init -> optimizer), resume, then ``run`` the loop.

    What builds the parts is ``tfx.build``; where the numbers go (metrics.jsonl, TensorBoard, the log)
    is ``self.report``'s job (``tfx.reporter``); the run folder's checkpoints (lock, saving, pruning,
    resume checks) are ``self.ckpts``'s.
    """

    def __init__(self, cfg: Config, run_dir: Path, on_update: UpdateHook | None = None) -> None:
        self.cfg = cfg
        self.on_update = on_update  # called after every update (studies measure things here)
        self.dist, self.device = distributed.setup(cfg.train.device)  # a missing device fails here
        if not self.dist.is_main:
            logging.getLogger("tfx").setLevel(logging.WARNING)  # rank 0 alone reports progress
        self.run_dir = Path(distributed.broadcast_object(str(run_dir)))
        self.ckpts = CheckpointManager(self.run_dir, cfg.train.keep_last, self.dist.rank)
        self.ckpts.open()  # writable, locked and clean before any data preparation
        try:
            self._build()
        except BaseException:
            self.ckpts.close()
            raise

    def _build(self) -> None:
        cfg = self.cfg
        build.seed_everything(cfg.train)
        self.corpus = build.prepare_corpus(cfg, self.dist.is_main)
        train = self.corpus.splits["train"]
        self.batches = TrainBatches(train, cfg.data, cfg.train.seed, self.dist.rank, self.dist.world_size)
        fresh = self.ckpts.resume_path(cfg.train.resume) is None
        vocab = self.corpus.tokenizer.vocab_size
        self.model = build.initialized_model(cfg, vocab, fresh, self.batches.first_padded)
        build.reseed_dropout(cfg.train.seed, self.dist.rank)
        self.precision, self.optimizer = build.place_and_optimize(self.model, cfg, self.device)
        self.state = TrainState()
        self.resumed_from = self._maybe_resume()
        self.net: nn.Module = self._wrap(self.model)
        main_dir = self.run_dir if self.dist.is_main else None  # rank 0 alone writes
        self.report = Reporter(main_dir, self.state.step, cfg.train.log_every_updates)
        self.probe = build.output_probe(self.model, self.corpus, cfg.train, self.state.step, self.device)
        shown = self.dist.is_main and cfg.train.progress
        budget = Budget(cfg.train.max_updates or None, cfg.train.max_epochs or None, 60 * cfg.train.max_minutes or None)
        self.progress = Progress(shown, budget, self.state.step, cfg.train.log_every_updates)
        self._epoch_batches = 0  # batches in the current epoch (the summary's fraction of an epoch)
        self._pending: list[Pending] = []  # updates queued on the device, not read yet (tfx.step)
        self._prefetch: Prefetcher[list[Batch]] = Prefetcher(enabled=self.device.type == "cuda")
        self._saved_state: TrainState | None = None  # what checkpoint_last.pt holds (never write it twice)
        self._last_valid_time = self.state.train_seconds
        self.losses: list[float] = []  # per-update train loss of this process (tests compare these)

    def close(self) -> None:
        if hasattr(self, "report"):
            self.report.close()
            self._prefetch.close()
        self.ckpts.close()

    # ----------------------------------------------------------------- setup
    def _wrap(self, model: nn.Module) -> nn.Module:
        return build.wrap(model, self.cfg.train, self.dist, self.device, packed=self.batches.packed)

    def _maybe_resume(self) -> Path | None:
        """Continue from checkpoint_last.pt (or train.resume) when its trajectory matches ours."""
        ours = our_trajectory(self.cfg, self.corpus.tokenizer, self.dist.world_size, self.optimizer)
        force = self.cfg.train.resume_mode == "force"
        load = functools.partial(sharding.load_state_dicts, self.model, self.optimizer)
        sharded = sharding.is_sharded(self.model)  # every rank reads the file, mmap-ed: only rank 0's is used
        weights_only = self.cfg.train.resume_mode == "weights"  # e.g. after a damaged checkpoint_last.pt
        resumed = self.ckpts.resume(self.cfg.train.resume, ours, force, load, self.device, sharded, weights_only)
        if resumed is None:
            return None
        path, ckpt = resumed
        for group in self.optimizer.param_groups:  # the config's settings, not the saved ones (force)
            group.update(betas=tuple(self.cfg.optim.betas), eps=self.cfg.optim.eps)
            group.update(weight_decay=self.cfg.optim.weight_decay)
        self.state = TrainState(**ckpt["train_state"])
        self.precision.load_state_dict(ckpt.get("scaler", {}))  # fp16 loss scale; absent in older checkpoints
        log.info("resumed from %s at update %d (epoch %d)", path, self.state.step, self.state.epoch)
        return path

    # ------------------------------------------------------------ checkpoints
    def save(self, best: bool = False, numbered_epoch: int | None = None, whole_epoch: bool = False) -> None:
        """checkpoint_last.pt unless it already holds this very state; best/numbered weights-only copies.

        Only the last checkpoint resumes, so only it carries the optimizer, RNG and iterator state; without
        Adam's moments best and numbered ones are a third of the size (4 GB, not 13, at 200+200 layers, d 512).
        Every rank calls this: each one's RNG state (and FSDP shards) go in; ``_validate`` keeps states alike.
        """
        self._flush()  # a checkpoint holds only counted updates
        rngs = distributed.gather_to_main(rng_state(self.device))
        write_last = self.state != self._saved_state
        self._saved_state = dataclasses.replace(self.state)
        if write_last or best or numbered_epoch is not None:
            payload = checkpoint_payload(self.model, self.optimizer, self.state, self.precision, self.cfg,
                                         self.corpus.tokenizer, self.dist.world_size, rngs)  # fmt: skip
            self.ckpts.save(payload, write_last, best, numbered_epoch, whole_epoch)

    # ------------------------------------------------------------------ step
    def train_step(self, batches: list[Batch], record_layers: bool = False) -> dict[str, float]:
        """One update over ``update_freq`` micro-batches, read at once into a flat metrics dict.

        The loop does not read each update: ``_update`` leaves it pending on the device (``tfx.step``).
        """
        self._pending.append(self._step(batches, record_layers))
        ((metrics, _applied),) = account(self.state, self._read())
        return metrics

    def _step(self, batches: list[Batch], record_layers: bool) -> Pending:
        """Queue one update; its lr counts the unread updates as applied (they are, unless non-finite)."""
        lr = lr_at(self.state.step + len(self._pending), self.cfg.optim)
        stepper = Stepper(self.model, self.net, self.optimizer, self.precision, self.cfg.optim, self.device,
                          self.dist.world_size)  # fmt: skip
        with compilation.eager() if record_layers else contextlib.nullcontext():  # the statistics hook layers
            return stepper.update(batches, lr, record_layers)

    def _read(self) -> list[dict[str, float]]:
        tic, (pending, self._pending) = time.perf_counter(), (self._pending, [])
        raw = read(pending)
        self.state.train_seconds += time.perf_counter() - tic  # the wait for the device is training time
        return raw

    # ------------------------------------------------------------------ loop
    def run(self) -> dict[str, Any]:
        """Epochs of updates until the budget is spent or a signal arrives; then validate and save."""
        n_params = sum(p.numel() for p in self.model.parameters())
        self.report.start(self.run_dir, self.cfg, n_params, self.device, self.precision.name, self.dist.world_size)
        started = time.perf_counter()
        with StopSignal() as stop:
            try:
                with self.progress.shown():  # a bar on a terminal, log lines above it
                    self._loop(stop)
            except TrainingDiverged:
                self.report.end(self.state.step, "diverged", self.state.train_seconds)
                raise
        return self._finish(stop, time.perf_counter() - started)

    def _loop(self, stop: StopSignal) -> None:
        """Epochs of updates, each validating and saving at its end, until a limit or a signal stops them."""
        while not self._should_stop(stop):
            batches = self.batches.epoch(self.state.epoch)
            self._epoch_batches = len(batches)
            left = math.ceil((len(batches) - self.state.batch_in_epoch) / self.cfg.train.update_freq)
            per_epoch = math.ceil(len(batches) / self.cfg.train.update_freq)
            self.progress.epoch_planned(self.state.step + left - per_epoch, self.state.epoch, per_epoch)
            while self.state.batch_in_epoch < len(batches) and not self._should_stop(stop):
                self._update(batches)
                self._validate_and_save_if_due()
            if self.state.batch_in_epoch >= len(batches):
                self._end_epoch()

    def _update(self, batches: list) -> None:
        """Queue one update from the next ``update_freq`` batches; read the queue when anything is due."""
        t = self.cfg.train
        start = self.state.batch_in_epoch
        pin = self.device.type == "cuda"
        make = functools.partial(self.batches.collate_group, batches, size=t.update_freq, pin=pin)
        group = self._prefetch.get((self.state.epoch, start), lambda: make(start))
        step = self.state.step + len(self._pending)  # unread updates counted as applied
        record = t.layer_stats_every_updates > 0 and step % t.layer_stats_every_updates == 0
        tic = time.perf_counter()
        self._pending.append(self._step(group, record))
        self.state.train_seconds += time.perf_counter() - tic
        self.state.batch_in_epoch = after = start + len(group)
        if after < len(batches):  # built while the device runs this update (GPU; inline on CPU)
            self._prefetch.prepare((self.state.epoch, after), lambda: make(after))
        if record or self._read_due(step + 1):
            self._flush()

    def _read_due(self, step: int) -> bool:
        """Whether update ``step`` (unread ones counted as applied) logs, validates, saves, stops or probes."""
        t = self.cfg.train
        probing = self.probe is not None and step <= t.probe_updates
        return (self.on_update is not None or probing or step % t.log_every_updates == 0
                or len(self._pending) >= t.log_every_updates or any(self._save_or_valid_due(step))
                or not dataclasses.replace(self.state, step=step).budget_left(t))  # fmt: skip

    def _flush(self) -> None:
        """Read the queued updates (one sync), then count, log and hand each to the hook, in order."""
        if not self._pending:
            return
        t = self.cfg.train
        for metrics, applied in account(self.state, self._read()):
            self.losses.append(metrics["train/loss"])
            if applied and self.probe is not None and self.state.step <= t.probe_updates:
                with compilation.eager():
                    metrics.update(self.probe.measure(self.model))
            event = "update" if applied else "skipped"  # skipped: a non-finite step (or an fp16 overflow)
            self.report.update(event, self.state.step, self.state.epoch, metrics)
            self.state.check_finite(t.max_bad_steps, self.ckpts.last_good)
            if self.on_update is not None:
                self.on_update(self, metrics)
            layers = any(k.startswith("layers/") for k in metrics)
            self.report.scalars(self.state.step, self.state.epoch, metrics, force=layers)
            self.progress.update(self.state.step, self.state.epoch, metrics, self.state.train_seconds)

    def _save_or_valid_due(self, step: int) -> tuple[bool, bool]:
        """(numbered save due, validation due) at update ``step``."""
        t = self.cfg.train
        save_due = bool(t.save_every_updates) and step % t.save_every_updates == 0
        minutes_due = t.validate_every_minutes and (
            self.state.train_seconds - self._last_valid_time >= 60 * t.validate_every_minutes
        )
        valid_due = bool(t.validate_every_updates) and step % t.validate_every_updates == 0 or bool(minutes_due)
        return save_due, valid_due

    def _validate_and_save_if_due(self) -> None:
        """Numbered saves and validations on their schedules; one write when both fall on this update."""
        if self._pending:  # not due: ``_update`` reads the queue whenever one of them could be
            return
        save_due, valid_due = self._save_or_valid_due(self.state.step)
        best = False
        if valid_due:
            self._last_valid_time = self.state.train_seconds
            best = self._validate()
        if save_due or valid_due:
            self.save(best=best, numbered_epoch=self.state.epoch if save_due else None)

    def _end_epoch(self) -> None:
        """Validate and save; a numbered checkpoint carries the epoch that just finished."""
        self._flush()
        finished = self.state.epoch
        self.state.epoch += 1
        self.state.batch_in_epoch = 0
        t = self.cfg.train
        numbered = finished if t.save_every_epochs and finished % t.save_every_epochs == 0 else None
        # with numbered saves by epoch only, this one replaces what a stop wrote earlier in the same epoch
        self.save(best=self._validate(), numbered_epoch=numbered, whole_epoch=not t.save_every_updates)

    def _should_stop(self, stop: StopSignal) -> bool:
        """Every rank must agree, or DDP would hang: stop if any rank wants to."""
        assumed = dataclasses.replace(self.state, step=self.state.step + len(self._pending))
        if stop.received is not None or not assumed.budget_left(self.cfg.train):
            self._flush()  # the exact count decides
        local = 0.0 if self.state.budget_left(self.cfg.train) and stop.received is None else 1.0
        return distributed.all_reduce_sum(local, self.device) > 0

    def _validate(self) -> bool:
        """Validate (rank 0; autocast for bf16 only) unless this update already was; True when BLEU improved."""
        if self.state.validated_step == self.state.step:
            return False
        self.state.validated_step = self.state.step
        cfg, bf16, main = self.cfg, self.precision.bf16, self.dist.is_main
        with compilation.eager():
            result = validate_on_main(self.model, self.corpus, cfg, self.device, bf16, main)
        improved, loss = False, math.inf
        if result is not None:
            improved = result.bleu > self.state.best_bleu
            loss = result.metrics["valid/loss"]
            self.state.best_bleu = max(self.state.best_bleu, result.bleu)
            self.state.best_step = self.state.step if improved else self.state.best_step
            self.report.valid(self.state.step, result, self.state.best_bleu, self.state.train_seconds / 60)
        # Every rank keeps the same state (save decides from it) and learns whether this was the best.
        improved, loss, self.state.best_bleu, self.state.best_step = distributed.broadcast_object(
            (improved, loss, self.state.best_bleu, self.state.best_step)
        )
        self.state.count_patience(improved, loss, self.cfg.train.patience_metric)
        self.report.restart_window()  # validation time is not training throughput
        return improved

    def _finish(self, stop: StopSignal, wall_seconds: float) -> dict[str, Any]:
        self._flush()
        # _validate is a no-op when the last epoch end already validated (and saved) this update.
        improved = stop.received is None and self._validate()
        self.save(best=improved, numbered_epoch=self._final_numbered_epoch())
        if stop.received is not None:
            self.report.stopped(stop.received, self.state.step, self.ckpts.dir / "checkpoint_last.pt")
        status = self.state.end_status(self.cfg.train) if stop.received is None else f"stopped by {stop.received}"
        self.report.end(self.state.step, status, self.state.train_seconds)
        self.report.final(self.cfg)
        epochs = self.state.epoch - 1 + self.state.batch_in_epoch / max(self._epoch_batches, 1)
        self.report.summary(self.state, epochs, wall_seconds, self.ckpts.dir, status)
        return {**self.state.summary(), "losses": self.losses, "stopped_by": stop.received}

    def _final_numbered_epoch(self) -> int | None:
        """The epoch label of a numbered checkpoint of the final state, so that ``--avg N`` covers the end of
        training (a time budget or a signal stops mid-epoch); None when numbered saves are off or one exists."""
        t = self.cfg.train
        written = distributed.broadcast_object(self.ckpts.has_numbered(self.state.step))  # rank 0's folder decides
        if not (t.save_every_epochs or t.save_every_updates) or written:
            return None
        return self.state.epoch if self.state.batch_in_epoch else self.state.epoch - 1


def train(cfg: Config, run_dir: Path, on_update: UpdateHook | None = None) -> dict[str, Any]:
    """Train one run into ``run_dir`` (resuming from its checkpoint_last.pt if present)."""
    trainer = None
    try:
        trainer = Trainer(cfg, run_dir, on_update)
        return trainer.run()
    finally:
        if trainer is not None:
            trainer.close()
        distributed.teardown()


register_configs()


def _run_context() -> tuple[Path, bool]:
    """This job's run folder, and whether it is one point of a multirun sweep."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    return Path(hydra_cfg.runtime.output_dir), hydra_cfg.mode == RunMode.MULTIRUN


def _main(cfg_node: Any) -> float:
    try:
        cfg: Config = to_config(cfg_node)
    except ValueError as e:
        log.error("config error: %s", e)
        sys.exit(2)
    run_dir, sweeping = _run_context()
    try:
        summary = train(cfg, run_dir)
    except TrainingDiverged as e:
        log.error("%s", e)
        if sweeping:  # a finding, not a failure: SystemExit in a launcher's worker would abort every other point
            return math.nan  # the run's metrics.jsonl ends with status "diverged"
        sys.exit(1)
    except (DataError, CheckpointError, DeviceError, ShardingError, PrecisionError) as e:
        log.error("%s", e)
        sys.exit(1)
    except RuntimeError as e:
        if not (cfg.train.deterministic and "deterministic" in str(e)):
            raise
        log.error("train.deterministic=true: %s; set train.deterministic=false", str(e).splitlines()[0].rstrip("."))
        sys.exit(1)
    return summary["best_bleu"]


def refuse_unknown_overrides(argv: list[str]) -> None:
    """Exit 2 with one line for a command-line ``key=value`` (``+``/``++``/``~`` too) that names no config key, with
    the closest known ones: Hydra's own refusal is eight lines without a suggestion, and with ``+`` it accepts it."""
    for arg in argv:
        key = arg.split("=", 1)[0].lstrip("+~")
        if arg.startswith("-") or "=" not in arg or "." not in key:
            continue  # an option, or a config group choice (method=preln, +experiment=iwslt)
        if (why := unknown_key(key)) is not None:
            print(f"config error: {why}", file=sys.stderr)
            sys.exit(2)


def main() -> None:
    import hydra

    refuse_unknown_overrides(sys.argv[1:])
    hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(_main)()


if __name__ == "__main__":
    main()

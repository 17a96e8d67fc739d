"""``python -m tfx.train [+experiment=NAME] [key=value ...]``: the Hydra entry point and the loop.

Order: data -> model -> init -> optimizer. Adam without warmup (T-Fixup) or with it
(Post-LN baseline), label-smoothed cross-entropy, BLEU validation, TensorBoard under
``<run>/tb``, checkpoints under ``<run>/checkpoints`` (``tfx.run_checkpoints``). Runs as is on one device or
under ``torchrun --nproc_per_node=K`` (DDP, or FSDP with ``train.strategy=fsdp``: ``tfx.sharding``;
rank 0 alone logs and writes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tfx import distributed, sharding
from tfx.checkpoint import CheckpointError, git_sha
from tfx.config import CONF_DIR, Config, TrainConfig, register_configs
from tfx.criterion import label_smoothed_loss
from tfx.data import PAD, Batch, DataError, collate, make_batches, prepare_data
from tfx.diagnostics import ActivationRMS, OutputChange, layer_stats
from tfx.distributed import DeviceError
from tfx.init import NEEDS_BATCH, apply_init
from tfx.logger import Progress, RunLogger
from tfx.metrics_log import MetricsLog
from tfx.model import Transformer, build_model
from tfx.optim import build_optimizer, lr_at, set_lr
from tfx.precision import Precision, PrecisionError, StepOutcome
from tfx.run_checkpoints import CheckpointManager, our_trajectory, rng_state
from tfx.sharding import ShardingError
from tfx.validate import validate

log = logging.getLogger("tfx.train")


UpdateHook = Callable[["Trainer", dict[str, float]], None]


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
    bad_steps: int = 0  # consecutive non-finite steps
    skipped_steps: int = 0  # all non-finite steps so far
    overflow_steps: int = 0  # fp16 updates skipped by the loss scaler (not divergence; not in bad_steps)

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

    def budget_left(self, t: TrainConfig) -> bool:
        """Whether max_updates, max_epochs and max_minutes (0 = unlimited) all leave room."""
        if t.max_updates and self.step >= t.max_updates:
            return False
        if t.max_epochs and self.epoch > t.max_epochs:
            return False
        return not (t.max_minutes and self.train_seconds >= 60 * t.max_minutes)


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


# Ranks start from identical weights (the init is seeded with train.seed on every rank), then
# draw different dropout masks: rank r > 0 reseeds its stream with seed + r * this stride.
DROPOUT_SEED_STRIDE = 1_000_003


class Trainer:
    """One run: build (data -> model -> init -> optimizer), resume, then ``run`` the loop.

    The run folder's checkpoints (lock, saving, pruning, resume checks) are ``self.ckpts``'s job.
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
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        self.corpus = self._prepare_data()
        self.model: Transformer = build_model(cfg.model, self.corpus.tokenizer.vocab_size, PAD)
        # A resumed run reads every weight (Admin's omega too) from its checkpoint: no init, no profiling.
        if self.ckpts.resume_path(cfg.train.resume) is None:
            batch = self._first_batch() if cfg.init.name in NEEDS_BATCH else None
            apply_init(self.model, cfg.init.name, seed=cfg.train.seed, batch=batch)
        if self.dist.rank > 0:
            torch.manual_seed(cfg.train.seed + DROPOUT_SEED_STRIDE * self.dist.rank)
        self.model.to(self.device)
        self.precision = Precision(cfg.train.precision, self.device)
        if cfg.train.strategy == "fsdp":  # before the optimizer, which must hold the sharded parameters
            sharding.shard(self.model, self.device, self.precision.bf16)
        self.optimizer = build_optimizer(self.model, cfg.optim, self.device)
        self.bf16 = self.precision.bf16  # validation autocasts only for bf16 (fp16 validates in fp32)
        self.state = TrainState()
        self.resumed_from = self._maybe_resume()
        self.net: nn.Module = self._wrap(self.model)
        self.logger = RunLogger(self.run_dir if self.dist.is_main else None)
        self.metrics_log = MetricsLog(self.run_dir if self.dist.is_main else None, self.state.step)
        self.probe = self._output_probe()
        self.progress = Progress(
            self.dist.is_main and cfg.train.progress, cfg.train.max_updates or None, self.state.step,
            cfg.train.log_every_updates,
        )  # fmt: skip
        self._validated_at = -1  # update of the latest validation (never validate twice at one update)
        self._saved_state: TrainState | None = None  # what checkpoint_last.pt holds (never write it twice)
        self._last_valid_time = self.state.train_seconds
        self._window = (0.0, time.perf_counter())  # tokens and start time of the throughput window
        self.losses: list[float] = []  # per-update train loss of this process (tests compare these)

    def close(self) -> None:
        if hasattr(self, "logger"):
            self.logger.close()  # also when training diverged: flush what TensorBoard has
        if hasattr(self, "metrics_log"):
            self.metrics_log.close()
        self.ckpts.close()

    # ----------------------------------------------------------------- setup
    def _prepare_data(self):
        """Rank 0 trains/caches the vocabulary first; the other ranks then read its cache."""
        if not self.dist.is_main:
            distributed.barrier()
        corpus = prepare_data(self.cfg.data, seed=self.cfg.train.seed)
        if self.dist.is_main:
            distributed.barrier()
        return corpus

    def _wrap(self, model: nn.Module) -> nn.Module:
        net = model
        if self.cfg.train.compile:
            net = torch.compile(net, dynamic=True)  # token-bucketed batches change shape every step
        if self.dist.enabled and not sharding.is_sharded(model):
            ids = [self.device.index] if self.device.type == "cuda" else None
            net = nn.parallel.DistributedDataParallel(net, device_ids=ids)
        return net

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
    def _payload(self, rngs: list[dict[str, Any]]) -> dict[str, Any]:
        model_state, optim_state = sharding.state_dicts(self.model, self.optimizer)  # FSDP: gathered on rank 0
        return {
            "model": model_state,
            "optimizer": optim_state,
            "optimizer_name": type(self.optimizer).__name__,
            "train_state": dataclasses.asdict(self.state),
            "step": self.state.step,
            "epoch": self.state.epoch,
            "rng": rngs,
            "scaler": self.precision.state_dict(),
            "world_size": self.dist.world_size,
            "config": dataclasses.asdict(self.cfg),
            "spm_model": self.corpus.tokenizer.model_bytes,
            "vocab_size": self.corpus.tokenizer.vocab_size,
            "metrics": {"best_bleu": self.state.best_bleu},
            "git_sha": git_sha(),
        }

    def save(self, best: bool = False, numbered_epoch: int | None = None) -> None:
        """checkpoint_last.pt unless it already holds this very state; best/numbered weights-only copies.

        Only the last checkpoint resumes, so only it carries the optimizer, RNG and iterator
        state; best and numbered ones are for evaluation and averaging, and without Adam's two
        moments they are a third of the size (4 GB instead of 13 GB at 200+200 layers, d 512).
        Every rank calls this: each one's RNG state goes into the checkpoint (and under FSDP each
        one's shards); ``_validate`` gives every rank the same state, so all decide alike.
        """
        rngs = distributed.gather_to_main(rng_state(self.device))
        write_last = self.state != self._saved_state
        self._saved_state = dataclasses.replace(self.state)
        if write_last or best or numbered_epoch is not None:
            self.ckpts.save(self._payload(rngs), write_last, best, numbered_epoch)

    # ------------------------------------------------------------------ step
    def train_step(self, batches: list[Batch], record_layers: bool = False) -> dict[str, float]:
        """One update over ``update_freq`` micro-batches; returns a flat metrics dict.

        The loss is summed over tokens and divided by the token count of the whole update
        across all ranks (times world size, since DDP averages gradients), so K ranks or
        K accumulated micro-batches give the same gradient as one big batch.
        """
        opt = self.cfg.optim
        ntokens = distributed.all_reduce_sum(sum(b.ntokens for b in batches), self.device)
        lr = lr_at(self.state.step, opt)
        set_lr(self.optimizer, lr)
        # train() walks every module (~40 ms at 200+200 layers), so only when something left the
        # inner model in eval mode (validation restores it); a DDP/compile wrapper keeps its own flag.
        if not self.model.training:
            self.net.train()
        sums: list[torch.Tensor] = []  # (loss, nll) per micro-batch, read once: no host sync per micro-batch
        for i, batch in enumerate(batches):
            if self.device.type == "cuda":
                batch = batch.pin_memory()  # pinned host memory makes the non_blocking copy truly async
            batch = batch.to(self.device, non_blocking=True)
            last = i == len(batches) - 1
            sharding.sync(self.model, last)  # FSDP: reduce-scatter only after the last micro-batch
            ddp = isinstance(self.net, nn.parallel.DistributedDataParallel)
            sync = self.net.no_sync() if ddp and not last else contextlib.nullcontext()
            recorder = ActivationRMS(self.model) if record_layers and last else None
            with sync, recorder or contextlib.nullcontext(), self.precision.autocast():
                logits = self.net(batch.src_tokens, batch.prev_output_tokens)
                loss, nll = label_smoothed_loss(logits, batch.target, opt.label_smoothing, PAD)
            self.precision.backward(loss * self.dist.world_size / max(ntokens, 1.0))
            sums.append(torch.stack([loss.detach(), nll.detach()]))
        clip = opt.clip_norm if opt.clip_norm > 0 else math.inf
        grad_norm = self.precision.unscale_and_clip(self.optimizer, self.model.parameters(), clip)
        loss_sum, nll_sum = torch.stack(sums).double().sum(0).tolist()  # after clip's own sync
        metrics = {"train/grad_norm": grad_norm, "train/lr": lr}
        if record_layers:  # per-layer grad norms and activation RMS: what LayerNorm would otherwise hide
            metrics.update({f"layers/{k}": v for k, v in layer_stats(self.model, recorder).items()})
        # Reduced before the step so every rank tells an fp16 overflow from a non-finite loss alike.
        loss_sum = distributed.all_reduce_sum(loss_sum, self.device) / max(ntokens, 1.0)
        nll_sum = distributed.all_reduce_sum(nll_sum, self.device) / max(ntokens, 1.0)
        self.state.record(self.precision.step(self.optimizer, grad_norm, loss_finite=math.isfinite(loss_sum)))
        self.optimizer.zero_grad(set_to_none=True)
        if self.precision.scaling:
            metrics["train/loss_scale"] = self.precision.loss_scale
            metrics["train/overflow_steps"] = float(self.state.overflow_steps)
        metrics["train/skipped_steps"] = float(self.state.skipped_steps)
        return {**metrics, **loss_metrics(loss_sum, nll_sum, ntokens)}

    def _check_finite(self) -> None:
        if self.state.bad_steps >= self.cfg.train.max_bad_steps:
            raise TrainingDiverged(
                f"{self.state.bad_steps} consecutive non-finite steps at update {self.state.step} "
                f"(epoch {self.state.epoch}); {self.ckpts.last_good()}. Lower optim.lr or set optim.clip_norm."
            )

    # ------------------------------------------------------------------ loop
    def run(self) -> dict[str, Any]:
        """Epochs of updates until the budget is spent or a signal arrives; then validate and save."""
        self._log_start()
        with StopSignal() as stop:
            try:
                while not self._should_stop(stop):
                    batches = self._epoch_batches()
                    while self.state.batch_in_epoch < len(batches) and not self._should_stop(stop):
                        self._update(batches)
                        self._validate_and_save_if_due()
                    if self.state.batch_in_epoch >= len(batches):
                        self._end_epoch()
            except TrainingDiverged:
                self._log_end("diverged")
                raise
        self.progress.close()
        return self._finish(stop)

    def _epoch_batches(self, epoch: int | None = None, rank: int | None = None) -> list:
        """This rank's batches of the current epoch (a pure function of seed, epoch and rank)."""
        return make_batches(
            self.corpus.splits["train"], self.cfg.data.max_tokens, self.cfg.data.max_sentences, shuffle=True,
            seed=self.cfg.train.seed, epoch=self.state.epoch if epoch is None else epoch,
            rank=self.dist.rank if rank is None else rank, world_size=self.dist.world_size,
        )  # fmt: skip

    def _output_probe(self) -> OutputChange | None:
        """The output-change probe on the first ``probe_sentences`` valid pairs, while updates remain to probe."""
        t, valid = self.cfg.train, self.corpus.splits["valid"]
        if self.state.step >= t.probe_updates or len(valid) == 0:
            return None
        return OutputChange(self.model, collate(valid, list(range(min(t.probe_sentences, len(valid))))), self.device)

    def _first_batch(self) -> Batch:
        """The first training batch of rank 0, for schemes that profile the model (Admin): the same
        on every rank, so every rank initializes the same weights."""
        return collate(self.corpus.splits["train"], self._epoch_batches(epoch=1, rank=0)[0])

    def _update(self, batches: list) -> None:
        """One update from the next ``update_freq`` batches, then the hook, logs and progress."""
        t = self.cfg.train
        start = self.state.batch_in_epoch
        group = [collate(self.corpus.splits["train"], ix) for ix in batches[start : start + t.update_freq]]
        record = t.layer_stats_every_updates > 0 and self.state.step % t.layer_stats_every_updates == 0
        step_before = self.state.step
        tic = time.perf_counter()
        metrics = self.train_step(group, record_layers=record)
        self.state.train_seconds += time.perf_counter() - tic
        self.state.batch_in_epoch = start + len(group)
        self.losses.append(metrics["train/loss"])
        applied = self.state.step > step_before
        if applied and self.probe is not None and self.state.step <= t.probe_updates:
            metrics.update(self.probe.measure(self.model))
        event = "update" if applied else "skipped"  # skipped: a non-finite step (or an fp16 overflow)
        self.metrics_log.write(event, self.state.step, {"epoch": self.state.epoch, **metrics})
        self._check_finite()
        if self.on_update is not None:
            self.on_update(self, metrics)
        self._log_scalars(metrics, force=record)
        self.progress.update(self.state.step, self.state.epoch, metrics)

    def _validate_and_save_if_due(self) -> None:
        """Numbered saves and validations on their schedules; one write when both fall on this update."""
        t, step = self.cfg.train, self.state.step
        save_due = bool(t.save_every_updates) and step % t.save_every_updates == 0
        minutes_due = t.validate_every_minutes and (
            self.state.train_seconds - self._last_valid_time >= 60 * t.validate_every_minutes
        )
        valid_due = bool(t.validate_every_updates) and step % t.validate_every_updates == 0 or bool(minutes_due)
        best = False
        if valid_due:
            self._last_valid_time = self.state.train_seconds
            best = self._validate()
        if save_due or valid_due:
            self.save(best=best, numbered_epoch=self.state.epoch if save_due else None)

    def _end_epoch(self) -> None:
        """Validate and save; a numbered checkpoint carries the epoch that just finished."""
        finished = self.state.epoch
        self.state.epoch += 1
        self.state.batch_in_epoch = 0
        every = self.cfg.train.save_every_epochs
        self.save(best=self._validate(), numbered_epoch=finished if every and finished % every == 0 else None)

    def _should_stop(self, stop: StopSignal) -> bool:
        """Every rank must agree, or DDP would hang: stop if any rank wants to."""
        local = 0.0 if self.state.budget_left(self.cfg.train) and stop.received is None else 1.0
        return distributed.all_reduce_sum(local, self.device) > 0

    def _validate(self) -> bool:
        """Validate (rank 0) unless this update already was; True when BLEU improved (the caller saves)."""
        if self._validated_at == self.state.step:
            return False
        self._validated_at = self.state.step
        build = functools.partial(build_model, self.cfg.model, self.corpus.tokenizer.vocab_size, PAD)
        model = sharding.unsharded(self.model, build, self.device)  # FSDP: every rank gathers, rank 0 gets a copy
        improved = self._validate_on_main(model) if self.dist.is_main else False
        del model
        # Every rank keeps the same state (save decides from it) and learns whether this was the best.
        improved, self.state.best_bleu = distributed.broadcast_object((improved, self.state.best_bleu))
        self._window = (0.0, time.perf_counter())  # validation time is not training throughput
        return improved

    def _validate_on_main(self, model: Transformer) -> bool:
        """Validation loss and BLEU, logged; True when BLEU improved."""
        result = validate(model, self.corpus, self.cfg, self.device, self.bf16)
        improved = result.bleu > self.state.best_bleu
        self.state.best_bleu = max(self.state.best_bleu, result.bleu)
        minutes = self.state.train_seconds / 60
        metrics = {**result.metrics, "valid/best_bleu": self.state.best_bleu, "valid/train_minutes": minutes}
        self.logger.scalars(metrics, self.state.step)
        self.metrics_log.write("valid", self.state.step, metrics)
        self.logger.translations("valid/samples", result.samples, self.state.step)
        log.info(
            "validation at update %d (%.1f train min): loss %.3f | BLEU %.2f (best %.2f) | %s",
            self.state.step, minutes, result.metrics["valid/loss"], result.bleu, self.state.best_bleu,
            result.signature,
        )  # fmt: skip
        return improved

    def _finish(self, stop: StopSignal) -> dict[str, Any]:
        # _validate is a no-op when the last epoch end already validated (and saved) this update.
        improved = stop.received is None and self._validate()
        self.save(best=improved)
        if stop.received is not None:
            log.warning(
                "stopped by %s at update %d; wrote %s; re-run the same command to resume",
                stop.received, self.state.step, self.ckpts.dir / "checkpoint_last.pt",
            )  # fmt: skip
        self._log_end("completed" if stop.received is None else f"stopped by {stop.received}")
        final = {"hparam/best_bleu": self.state.best_bleu, "hparam/updates": self.state.step}
        self.logger.hparams(hparams(self.cfg), final)
        return {
            "best_bleu": self.state.best_bleu,
            "step": self.state.step,
            "epoch": self.state.epoch,
            "losses": self.losses,
            "stopped_by": stop.received,
            "train_seconds": self.state.train_seconds,
        }

    # --------------------------------------------------------------- logging
    def _log_scalars(self, metrics: dict[str, float], force: bool) -> None:
        """TensorBoard scalars every ``log_every_updates`` (and with layer stats), with tokens/s."""
        tokens, start = self._window
        tokens += metrics["train/ntokens"]
        self._window = (tokens, start)
        if self.state.step % self.cfg.train.log_every_updates == 0 or force:
            metrics["train/tokens_per_s"] = tokens / max(time.perf_counter() - start, 1e-9)
            self._window = (0.0, time.perf_counter())
            self.logger.scalars({**metrics, "train/epoch": self.state.epoch}, self.state.step)

    def _log_end(self, status: str) -> None:
        self.metrics_log.write("end", self.state.step, {"status": status, "train_seconds": self.state.train_seconds})

    def _log_start(self) -> None:
        n_params = sum(p.numel() for p in self.model.parameters()) / 1e6
        log.info(
            "run folder %s | %s | %.2fM params | device %s %s | %d rank(s)",
            self.run_dir, describe(self.cfg), n_params, self.device, self.precision.name, self.dist.world_size,
        )  # fmt: skip


def loss_metrics(loss_sum: float, nll_sum: float, ntokens: float) -> dict[str, float]:
    """Per-token losses in bits, as fairseq reports them (``*_sum`` are already per token)."""
    bits = 1 / math.log(2)
    return {
        "train/loss": loss_sum * bits,
        "train/nll_loss": nll_sum * bits,
        "train/ppl": 2 ** min(nll_sum * bits, 100.0),
        "train/ntokens": ntokens,
    }


def describe(cfg: Config) -> str:
    """``experiment | 6+6 layers d512 norm=none init=tfixup``: the run in one phrase."""
    m = cfg.model
    layers = f"{m.encoder_layers}+{m.decoder_layers} layers d{m.d_model}"
    return f"{cfg.experiment} | {layers} norm={m.norm} init={cfg.init.name}"


def hparams(cfg: Config) -> dict[str, Any]:
    """The HParams-tab columns: what a comparison of runs varies."""
    return {
        "experiment": cfg.experiment,
        "norm": cfg.model.norm,
        "init": cfg.init.name,
        "encoder_layers": cfg.model.encoder_layers,
        "decoder_layers": cfg.model.decoder_layers,
        "d_model": cfg.model.d_model,
        "lr": cfg.optim.lr,
        "warmup_updates": cfg.optim.warmup_updates,
        "seed": cfg.train.seed,
        "data": cfg.data.name,
    }


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
    from omegaconf import OmegaConf

    try:
        cfg: Config = OmegaConf.to_object(cfg_node)
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
    return summary["best_bleu"]


def main() -> None:
    import hydra

    hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(_main)()


if __name__ == "__main__":
    main()

"""``python -m tfx.train [+experiment=NAME] [key=value ...]``: the Hydra entry point and the loop.

Order: data -> model -> init -> optimizer. Adam without warmup (T-Fixup) or with it
(Post-LN baseline), label-smoothed cross-entropy, BLEU validation, TensorBoard under
``<run>/tb``, atomic checkpoints under ``<run>/checkpoints``. Runs as is on one device or
under ``torchrun --nproc_per_node=K`` (DDP; rank 0 alone logs and writes).
"""

from __future__ import annotations

import contextlib
import dataclasses
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

from tfx import distributed
from tfx.checkpoint import (
    RESUME_KEYS,
    CheckpointError,
    atomic_copy,
    atomic_save,
    git_sha,
    load_checkpoint,
    weights_only_payload,
)
from tfx.config import Config, register_configs
from tfx.criterion import label_smoothed_loss
from tfx.data import PAD, Batch, DataError, collate, make_batches, prepare_data
from tfx.diagnostics import ActivationRMS, layer_stats
from tfx.init import apply_init
from tfx.logger import RunLogger
from tfx.model import Transformer, build_model
from tfx.optim import build_optimizer, lr_at, set_lr
from tfx.precision import Precision
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


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, on_update: UpdateHook | None = None) -> None:
        self.cfg = cfg
        self.on_update = on_update  # called after every update (studies measure things here)
        self.dist, self.device = distributed.setup(cfg.train.device)
        if not self.dist.is_main:
            logging.getLogger("tfx").setLevel(logging.WARNING)  # rank 0 alone reports progress
        self.run_dir = Path(distributed.broadcast_object(str(run_dir)))
        self.ckpt_dir = self.run_dir / "checkpoints"
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)
        self.corpus = self._prepare_data()
        self.model: Transformer = build_model(cfg.model, self.corpus.tokenizer.vocab_size, PAD)
        apply_init(self.model, cfg.init.name, seed=cfg.train.seed)
        self.model.to(self.device)
        self.optimizer = build_optimizer(self.model, cfg.optim, self.device)
        self.precision = Precision(cfg.train.precision, self.device)
        self.bf16 = self.precision.bf16  # validation autocasts only for bf16 (fp16 validates in fp32)
        self.state = TrainState()
        self.resumed_from = self._maybe_resume()
        self.net: nn.Module = self._wrap(self.model)
        self.logger = RunLogger(self.run_dir if self.dist.is_main else None)
        self._validated_at = -1  # update of the latest validation (never validate twice at one update)
        self._saved_at = -1  # update of the latest save (the end of a run does not rewrite the same update)
        self.losses: list[float] = []  # per-update train loss of this process (tests compare these)

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
        if self.dist.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            net = nn.parallel.DistributedDataParallel(net, device_ids=ids)
        return net

    def _maybe_resume(self) -> Path | None:
        path = Path(self.cfg.train.resume) if self.cfg.train.resume else self.ckpt_dir / "checkpoint_last.pt"
        if not path.exists():
            if self.cfg.train.resume:
                raise CheckpointError(f"train.resume={path} does not exist")
            return None
        ckpt = load_checkpoint(path, map_location=self.device)
        if any(k not in ckpt for k in RESUME_KEYS):
            raise CheckpointError(
                f"cannot resume from {path}: it holds weights only (best, numbered and averaged checkpoints do); "
                "resume from the run's checkpoint_last.pt"
            )
        saved_model = ckpt["config"]["model"]
        ours = dataclasses.asdict(self.cfg.model)
        changed = sorted(k for k in ours if k != "checkpoint_activations" and saved_model.get(k) != ours[k])
        if changed or ckpt["vocab_size"] != self.corpus.tokenizer.vocab_size:
            raise CheckpointError(
                f"cannot resume from {path}: model settings differ ({', '.join(changed) or 'vocab_size'}); "
                "use a new run folder (hydra.run.dir=...) or the same settings"
            )
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.state = TrainState(**ckpt["train_state"])
        set_rng_state(ckpt["rng"])
        self.precision.load_state_dict(ckpt.get("scaler", {}))  # fp16 loss scale; absent in older checkpoints
        log.info("resumed from %s at update %d (epoch %d)", path, self.state.step, self.state.epoch)
        return path

    # ------------------------------------------------------------ checkpoints
    def _payload(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "train_state": dataclasses.asdict(self.state),
            "step": self.state.step,
            "epoch": self.state.epoch,
            "rng": rng_state(),
            "scaler": self.precision.state_dict(),
            "config": dataclasses.asdict(self.cfg),
            "spm_model": self.corpus.tokenizer.model_bytes,
            "vocab_size": self.corpus.tokenizer.vocab_size,
            "metrics": {"best_bleu": self.state.best_bleu},
            "git_sha": git_sha(),
        }

    def save(self, best: bool = False, numbered: bool = False) -> None:
        """checkpoint_last.pt always; best and/or numbered as weights-only copies. Rank 0 only, atomic.

        Only the last checkpoint resumes, so only it carries the optimizer, RNG and iterator
        state; best and numbered ones are for evaluation and averaging, and without Adam's two
        moments they are a third of the size (4 GB instead of 13 GB at 200+200 layers, d 512).
        """
        self._saved_at = self.state.step
        if not self.dist.is_main:
            return
        payload = self._payload()
        atomic_save(payload, self.ckpt_dir / "checkpoint_last.pt")
        targets = []
        if best:
            targets.append(self.ckpt_dir / "checkpoint_best.pt")
        if numbered:
            targets.append(self.ckpt_dir / f"checkpoint_{self.state.epoch}_{self.state.step}.pt")
        if targets:
            atomic_save(weights_only_payload(payload), targets[0])
            for other in targets[1:]:
                atomic_copy(targets[0], other)
        if numbered:
            self._prune_numbered()

    def _prune_numbered(self) -> None:
        numbered = sorted(self.ckpt_dir.glob("checkpoint_*_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
        for old in numbered[: -self.cfg.train.keep_last]:
            old.unlink(missing_ok=True)

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
            sync = contextlib.nullcontext() if last or not self.dist.enabled else self.net.no_sync()
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
        outcome = self.precision.step(self.optimizer, grad_norm, loss_finite=math.isfinite(loss_sum))
        if outcome.applied:
            self.state.step += 1
            self.state.bad_steps = 0
        elif outcome.overflow:
            self.state.overflow_steps += 1
        else:
            self.state.bad_steps += 1
            self.state.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        if self.precision.scaling:
            metrics["train/loss_scale"] = self.precision.loss_scale
            metrics["train/overflow_steps"] = float(self.state.overflow_steps)
        metrics.update(
            {
                "train/loss": loss_sum / math.log(2),  # bits per token, as fairseq reports
                "train/nll_loss": nll_sum / math.log(2),
                "train/ppl": 2 ** min(nll_sum / math.log(2), 100.0),
                "train/ntokens": ntokens,
                "train/skipped_steps": float(self.state.skipped_steps),
            }
        )
        return metrics

    def _check_finite(self) -> None:
        if self.state.bad_steps >= self.cfg.train.max_bad_steps:
            last = self.ckpt_dir / "checkpoint_last.pt"
            where = f"last good checkpoint: {last}" if last.exists() else "no checkpoint was written yet"
            raise TrainingDiverged(
                f"{self.state.bad_steps} consecutive non-finite steps at update {self.state.step} "
                f"(epoch {self.state.epoch}); {where}. Lower optim.lr or set optim.clip_norm."
            )

    # ------------------------------------------------------------------ loop
    def _budget_left(self) -> bool:
        t = self.cfg.train
        if t.max_updates and self.state.step >= t.max_updates:
            return False
        if t.max_epochs and self.state.epoch > t.max_epochs:
            return False
        return not (t.max_minutes and self.state.train_seconds >= 60 * t.max_minutes)

    def _should_stop(self, stop: StopSignal) -> bool:
        """Every rank must agree, or DDP would hang: stop if any rank wants to."""
        local = 0.0 if self._budget_left() and stop.received is None else 1.0
        return distributed.all_reduce_sum(local, self.device) > 0

    def _validate(self) -> bool:
        """Validate (rank 0) unless this update already was; True when BLEU improved (the caller saves)."""
        if self._validated_at == self.state.step:
            return False
        self._validated_at = self.state.step
        improved = False
        if self.dist.is_main:
            result = validate(self.model, self.corpus, self.cfg, self.device, self.bf16)
            improved = result.bleu > self.state.best_bleu
            self.state.best_bleu = max(self.state.best_bleu, result.bleu)
            minutes = self.state.train_seconds / 60
            metrics = {**result.metrics, "valid/best_bleu": self.state.best_bleu, "valid/train_minutes": minutes}
            self.logger.scalars(metrics, self.state.step)
            self.logger.translations("valid/samples", result.samples, self.state.step)
            log.info(
                "validation at update %d (%.1f train min): loss %.3f | BLEU %.2f (best %.2f) | %s",
                self.state.step,
                minutes,
                result.metrics["valid/loss"],
                result.bleu,
                self.state.best_bleu,
                result.signature,
            )
        distributed.barrier()
        return improved

    def run(self) -> dict[str, Any]:
        t = self.cfg.train
        self._log_start()
        last_valid_time = self.state.train_seconds
        window_tokens, window_start = 0.0, time.perf_counter()
        bar = self._progress_bar()
        with StopSignal() as stop:
            while not self._should_stop(stop):
                train = self.corpus.splits["train"]
                rank, world = self.dist.rank, self.dist.world_size
                batches = make_batches(
                    train, self.cfg.data.max_tokens, self.cfg.data.max_sentences, shuffle=True,
                    seed=t.seed, epoch=self.state.epoch, rank=rank, world_size=world,
                )  # fmt: skip
                while self.state.batch_in_epoch < len(batches) and not self._should_stop(stop):
                    start = self.state.batch_in_epoch
                    group = [collate(train, ix) for ix in batches[start : start + t.update_freq]]
                    record = t.layer_stats_every_updates > 0 and self.state.step % t.layer_stats_every_updates == 0
                    tic = time.perf_counter()
                    metrics = self.train_step(group, record_layers=record)
                    self.state.train_seconds += time.perf_counter() - tic
                    self.state.batch_in_epoch = start + len(group)
                    self.losses.append(metrics["train/loss"])
                    window_tokens += metrics["train/ntokens"]
                    self._check_finite()
                    if self.on_update is not None:
                        self.on_update(self, metrics)
                    if self.state.step % t.log_every_updates == 0 or record:
                        elapsed = time.perf_counter() - window_start
                        metrics["train/tokens_per_s"] = window_tokens / max(elapsed, 1e-9)
                        window_tokens, window_start = 0.0, time.perf_counter()
                        self.logger.scalars({**metrics, "train/epoch": self.state.epoch}, self.state.step)
                    bar.update(1)
                    bar.set_postfix(
                        loss=f"{metrics['train/loss']:.3f}", lr=f"{metrics['train/lr']:.2e}", ep=self.state.epoch
                    )
                    if t.save_every_updates and self.state.step % t.save_every_updates == 0:
                        self.save(numbered=True)
                    minutes_due = t.validate_every_minutes and (
                        self.state.train_seconds - last_valid_time >= 60 * t.validate_every_minutes
                    )
                    if (t.validate_every_updates and self.state.step % t.validate_every_updates == 0) or minutes_due:
                        last_valid_time = self.state.train_seconds
                        self.save(best=self._validate())
                        window_start = time.perf_counter()
                if self.state.batch_in_epoch >= len(batches):
                    self.state.epoch += 1
                    self.state.batch_in_epoch = 0
                    numbered = bool(t.save_every_epochs) and (self.state.epoch - 1) % t.save_every_epochs == 0
                    self.save(best=self._validate(), numbered=numbered)
                    window_start = time.perf_counter()
        bar.close()
        return self._finish(stop)

    def _finish(self, stop: StopSignal) -> dict[str, Any]:
        # _validate is a no-op when the last epoch end already validated (and saved) this update.
        improved = stop.received is None and self._validate()
        if improved or self._saved_at != self.state.step:
            self.save(best=improved)
        if stop.received is not None:
            log.warning(
                "stopped by %s at update %d; wrote %s; re-run the same command to resume",
                stop.received,
                self.state.step,
                self.ckpt_dir / "checkpoint_last.pt",
            )
        self._log_hparams()
        self.logger.close()
        return {
            "best_bleu": self.state.best_bleu,
            "step": self.state.step,
            "epoch": self.state.epoch,
            "losses": self.losses,
            "stopped_by": stop.received,
            "train_seconds": self.state.train_seconds,
        }

    # --------------------------------------------------------------- logging
    def _progress_bar(self):
        from tqdm.auto import tqdm

        total = self.cfg.train.max_updates or None
        return tqdm(
            total=total,
            initial=self.state.step,
            desc="train",
            unit="upd",
            disable=not (self.dist.is_main and self.cfg.train.progress),
            mininterval=1.0,
            dynamic_ncols=True,
        )

    def _log_start(self) -> None:
        n_params = sum(p.numel() for p in self.model.parameters())
        m = self.cfg.model
        log.info(
            "run folder %s | %s | %d+%d layers d%d norm=%s init=%s | %.2fM params | device %s%s | %d rank(s)",
            self.run_dir,
            self.cfg.experiment,
            m.encoder_layers,
            m.decoder_layers,
            m.d_model,
            m.norm,
            self.cfg.init.name,
            n_params / 1e6,
            self.device,
            f" {self.precision.name}",
            self.dist.world_size,
        )

    def _log_hparams(self) -> None:
        c = self.cfg
        params = {
            "experiment": c.experiment,
            "norm": c.model.norm,
            "init": c.init.name,
            "encoder_layers": c.model.encoder_layers,
            "decoder_layers": c.model.decoder_layers,
            "d_model": c.model.d_model,
            "lr": c.optim.lr,
            "warmup_updates": c.optim.warmup_updates,
            "seed": c.train.seed,
            "data": c.data.name,
        }
        self.logger.hparams(params, {"hparam/best_bleu": self.state.best_bleu, "hparam/updates": self.state.step})


def train(cfg: Config, run_dir: Path, on_update: UpdateHook | None = None) -> dict[str, Any]:
    """Train one run into ``run_dir`` (resuming from its checkpoint_last.pt if present)."""
    trainer = None
    try:
        trainer = Trainer(cfg, run_dir, on_update)
        return trainer.run()
    finally:
        if trainer is not None:
            trainer.logger.close()  # also when training diverged: flush what TensorBoard has
        distributed.teardown()


register_configs()


def _main(cfg_node: Any) -> float:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    try:
        cfg: Config = OmegaConf.to_object(cfg_node)
    except ValueError as e:
        log.error("config error: %s", e)
        sys.exit(2)
    try:
        summary = train(cfg, Path(HydraConfig.get().runtime.output_dir))
    except (DataError, CheckpointError, TrainingDiverged) as e:
        log.error("%s", e)
        sys.exit(1)
    return summary["best_bleu"]


def main() -> None:
    import hydra

    hydra.main(version_base="1.3", config_path="../conf", config_name="config")(_main)()


if __name__ == "__main__":
    main()

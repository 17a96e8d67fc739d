"""One training update, computed on the device and read later: an ordinary update makes no host sync.

Reading a device tensor on the host (``.item()``, ``float()``, ``.tolist()``, ``if tensor``) waits for
every kernel queued before it, so a loop that reads its loss each update keeps the GPU idle while
the host prepares the next one. Here an update leaves its results as device tensors (``Pending``):
the loss sums, the gradient norm, whether the optimizer stepped (decided on the device:
``tfx.runtime.precision.step_unless``) and, under DDP, the token count all-reduced on the device. The
trainer reads a whole run of updates with one copy (``read``) when it logs, validates, saves, stops
or hands metrics to a hook. The loss is summed over tokens and divided by the token count of the
whole update across all ranks (times world size, since DDP averages gradients), so K ranks or K
accumulated micro-batches give the same gradient as one big batch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from tfx.checkpoints.train_state import TrainState
from tfx.config import OptimConfig
from tfx.data import PAD, Batch
from tfx.optim.loss import label_smoothed_loss
from tfx.optim.optimizers import set_lr
from tfx.reporting.statistics import ActivationRMS, layer_stats
from tfx.runtime import distributed, sharding
from tfx.runtime.precision import Precision, StepOutcome


@dataclass
class Pending:
    """An update's results: ``tensors`` still on the device (0-d each), ``host`` already numbers."""

    tensors: dict[str, Tensor]
    host: dict[str, float] = field(default_factory=dict)


@dataclass
class Stepper:
    """What an update needs: the model (and its DDP/compile wrapper ``net``), optimizer and precision."""

    model: nn.Module
    net: nn.Module
    optimizer: torch.optim.Optimizer
    precision: Precision
    opt: OptimConfig
    device: torch.device
    world_size: int

    def update(self, batches: list[Batch], lr: float, record_layers: bool = False) -> Pending:
        """Forward and backward over ``batches`` (the micro-batches of one update), clip, step."""
        ntokens = self._tokens(batches)
        # train() walks every module (~40 ms at 200+200 layers), so only when something left the
        # inner model in eval mode (validation restores it); a DDP/compile wrapper keeps its own flag.
        if not self.model.training:
            self.net.train()
        set_lr(self.optimizer, lr)
        sums, recorder = [], None  # (loss, nll) per micro-batch, summed on the device
        for i, batch in enumerate(batches):
            if self.device.type == "cuda" and not batch.src_tokens.is_pinned():
                batch = batch.pin_memory()  # pinned host memory makes the non_blocking copy truly async
            batch = batch.to(self.device, non_blocking=True)
            last = i == len(batches) - 1
            sharding.sync(self.model, last)  # FSDP: reduce-scatter only after the last micro-batch
            ddp = isinstance(self.net, nn.parallel.DistributedDataParallel)
            no_sync = self.net.no_sync() if ddp and not last else contextlib.nullcontext()
            recorder = ActivationRMS(self.model) if record_layers and last else None
            with no_sync, recorder or contextlib.nullcontext(), self.precision.autocast():
                logits = self.net(batch.src_tokens, batch.prev_output_tokens, batch.packing)
                loss, nll = label_smoothed_loss(logits, batch.target, self.opt.label_smoothing, PAD)
            denominator = ntokens.clamp(min=1.0) if isinstance(ntokens, Tensor) else max(ntokens, 1.0)
            self.precision.backward(loss * self.world_size / denominator)
            sums.append(torch.stack([loss.detach(), nll.detach()]))
        clip = self.opt.clip_norm if self.opt.clip_norm > 0 else math.inf
        grad_norm = self.precision.unscale_and_clip(self.optimizer, self.model.parameters(), clip)
        host = {"train/lr": lr}
        if record_layers:  # a logging update: per-layer grad norms and activation RMS (one sync)
            host.update({f"layers/{k}": v for k, v in layer_stats(self.model, recorder).items()})
        # Reduced before the step so every rank tells an fp16 overflow from a non-finite loss alike.
        loss_nll = distributed.all_reduce_sum(torch.stack(sums).double().sum(0), self.device)
        outcome = self.precision.step(self.optimizer, grad_norm, loss_finite=torch.isfinite(loss_nll[0]))
        self.optimizer.zero_grad(set_to_none=True)
        tensors = {"grad_norm": grad_norm, "loss": loss_nll[0], "nll": loss_nll[1],
                   "applied": outcome.applied, "overflow": outcome.overflow}  # fmt: skip
        if self.precision.scaling:
            tensors["loss_scale"] = self.precision.scale_tensor()
        if isinstance(ntokens, Tensor):
            tensors["ntokens"] = ntokens
        else:
            host["ntokens"] = float(ntokens)
        return Pending(tensors, host)

    def _tokens(self, batches: list[Batch]) -> int | Tensor:
        """This update's target tokens over all ranks: a number on one rank; under DDP a device tensor
        all-reduced on the device (``torch.full`` writes it there: no copy from the host to wait on)."""
        local = sum(b.ntokens for b in batches)
        if self.world_size == 1:
            return local
        on_device = torch.full((), float(local), dtype=torch.float64, device=self.device)
        return distributed.all_reduce_sum(on_device, self.device)


def read(pending: list[Pending]) -> list[dict[str, float]]:
    """Every pending update's numbers, with one device-to-host copy for all of them."""
    names = [list(p.tensors) for p in pending]
    flat = [t.detach().reshape(()).double() for p in pending for t in p.tensors.values()]
    values = iter(torch.stack(flat).tolist() if flat else [])
    return [{**p.host, **{name: next(values) for name in keys}} for p, keys in zip(pending, names, strict=True)]


def account(state: TrainState, raw: list[dict[str, float]]) -> Iterator[tuple[dict[str, float], bool]]:
    """Count each read update in ``state`` (applied, an fp16 overflow or non-finite) and yield its metrics
    dict and whether it applied: the caller handles one before the next is counted, so each sees the
    state as of its own update."""
    for r in raw:
        applied = bool(r["applied"])
        state.record(StepOutcome(r["grad_norm"], applied, bool(r["overflow"])))
        metrics = {"train/grad_norm": r["grad_norm"], "train/lr": r["train/lr"],
                   **{k: v for k, v in r.items() if k.startswith("layers/")}}  # fmt: skip
        if "loss_scale" in r:
            metrics["train/loss_scale"] = r["loss_scale"]
            metrics["train/overflow_steps"] = float(state.overflow_steps)
        metrics["train/skipped_steps"] = float(state.skipped_steps)
        metrics.update(loss_metrics(r["loss"], r["nll"], r["ntokens"]))
        yield metrics, applied


def loss_metrics(loss_sum: float, nll_sum: float, ntokens: float) -> dict[str, float]:
    """Per-token losses in bits, as fairseq reports them."""
    bits = 1 / math.log(2) / max(ntokens, 1.0)
    return {
        "train/loss": loss_sum * bits,
        "train/nll_loss": nll_sum * bits,
        "train/ppl": 2 ** min(nll_sum * bits, 100.0),
        "train/ntokens": ntokens,
    }

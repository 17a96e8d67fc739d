"""Adam and the inverse-sqrt schedules (with and without warmup).

The learning rate is a pure function of the update number, set on the optimizer
before each update: nothing to checkpoint but the step, and resume is exact.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tfx.config import OptimConfig


def lr_at(step: int, cfg: OptimConfig) -> float:
    """Learning rate for update ``step`` (0-based).

    - ``warmup_updates == 0`` (T-Fixup reference): lr * sqrt(offset / (offset + t)), no warmup;
      decays from the first update, with ``decay_offset`` = 4000 as in the reference.
    - ``warmup_updates = W > 0`` (fairseq ``inverse_sqrt``): linear from ``warmup_init_lr`` to
      lr over W updates, then lr * sqrt(W / t).
    """
    if cfg.warmup_updates == 0:
        return cfg.lr * math.sqrt(cfg.decay_offset / (cfg.decay_offset + step))
    if step < cfg.warmup_updates:
        return cfg.warmup_init_lr + (cfg.lr - cfg.warmup_init_lr) * step / cfg.warmup_updates
    return cfg.lr * math.sqrt(cfg.warmup_updates / step)


# One kernel per parameter (CUDA, and CPU since torch 2.4): 4x faster than foreach on CPU, where
# foreach loops over tensors op by op. Measured: 6400 tensors of 32x64, 0.093 s against 0.40 s.
FUSED_ADAM_DEVICES = ("cuda", "cpu")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW (decoupled weight decay, as fairseq's Adam): fused kernels where the device has them."""
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = dict(lr=lr_at(0, cfg), betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    if device.type in FUSED_ADAM_DEVICES:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    return torch.optim.AdamW(params, foreach=True, **kwargs)

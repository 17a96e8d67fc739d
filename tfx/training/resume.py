"""Where a run goes on from: its checkpoint_last.pt (or ``train.resume``) when the trajectory matches."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch
from torch import nn

from tfx.checkpoints.manager import CheckpointManager, our_trajectory
from tfx.checkpoints.train_state import TrainState
from tfx.config import Config
from tfx.data import Tokenizer
from tfx.runtime import sharding
from tfx.runtime.precision import Precision

log = logging.getLogger("tfx.train")


def resume_state(
    ckpts: CheckpointManager, cfg: Config, tokenizer: Tokenizer, world_size: int, model: nn.Module,
    optimizer: torch.optim.Optimizer, precision: Precision, device: torch.device,
) -> tuple[TrainState, Path | None]:  # fmt: skip
    """The loop's counters and the checkpoint they came from (weights, optimizer and loss scale loaded into
    ``model``, ``optimizer`` and ``precision``); a fresh state and None when there is nothing to resume."""
    ours = our_trajectory(cfg, tokenizer, world_size, optimizer)
    force = cfg.train.resume_mode == "force"
    load = functools.partial(sharding.load_state_dicts, model, optimizer)
    sharded = sharding.is_sharded(model)  # every rank reads the file, mmap-ed: only rank 0's is used
    weights_only = cfg.train.resume_mode == "weights"  # e.g. after a damaged checkpoint_last.pt
    resumed = ckpts.resume(cfg.train.resume, ours, force, load, device, sharded, weights_only)
    if resumed is None:
        return TrainState(), None
    path, ckpt = resumed
    for group in optimizer.param_groups:  # the config's settings, not the saved ones (force)
        group.update(betas=tuple(cfg.optim.betas), eps=cfg.optim.eps)
        group.update(weight_decay=cfg.optim.weight_decay)
    state = TrainState(**ckpt["train_state"])
    precision.load_state_dict(ckpt.get("scaler", {}))  # fp16 loss scale; absent in older checkpoints
    log.info("resumed from %s at update %d (epoch %d)", path, state.step, state.epoch)
    return state, path

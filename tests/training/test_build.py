"""tfx.training.build: seed_everything sets PyTorch's global modes from each run's own config, so a run in the same
process (a study, the test suite) does not inherit the previous run's; a warmup longer than a capped run is said at
start. CPU; no tensors are computed."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from tfx.config import Config, OptimConfig, TrainConfig
from tfx.training.build import place_and_optimize, seed_everything, warmup_outlasts_run


def test_a_deterministic_run_leaves_no_mode_behind_for_the_next() -> None:
    try:
        seed_everything(TrainConfig(deterministic=True, threads=0))
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.utils.deterministic.fill_uninitialized_memory is False  # the fill costs; nothing reads it
        seed_everything(TrainConfig(deterministic=False, threads=0))
        assert not torch.are_deterministic_algorithms_enabled()
        assert torch.utils.deterministic.fill_uninitialized_memory is True  # PyTorch's default, back
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = True


def test_a_warmup_that_outlasts_a_capped_run_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 67: optim.warmup_updates >= train.max_updates > 0 (DyT and Fixup capped at 300 toy updates) is said
    once at start, with how far the lr got; a warmup that ends in time, none, or no update cap says nothing."""
    optim = OptimConfig(lr=1e-3, warmup_updates=400, warmup_init_lr=0.0)
    assert warmup_outlasts_run(optim, TrainConfig(max_updates=300)) == (
        "optim.warmup_updates=400 >= train.max_updates=300: the run ends still warming up, at 75% of optim.lr=0.001; "
        "lower optim.warmup_updates or raise train.max_updates"
    )
    assert "at 100% of" in warmup_outlasts_run(optim, TrainConfig(max_updates=400))
    assert warmup_outlasts_run(optim, TrainConfig(max_updates=401)) is None
    assert warmup_outlasts_run(optim, TrainConfig(max_updates=0, max_epochs=3)) is None
    assert warmup_outlasts_run(OptimConfig(warmup_updates=0), TrainConfig(max_updates=300)) is None
    cfg = Config(optim=optim, train=TrainConfig(max_updates=300, threads=0))
    with caplog.at_level(logging.WARNING, logger="tfx.train"):
        place_and_optimize(nn.Linear(2, 2), cfg, torch.device("cpu"))
    assert [r.getMessage() for r in caplog.records] == [warmup_outlasts_run(optim, cfg.train)]

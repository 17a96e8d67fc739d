from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import tiny_model
from tfx.config import OptimConfig
from tfx.optim import build_optimizer, lr_at


def test_no_warmup_inverse_sqrt_matches_reference() -> None:
    cfg = OptimConfig(lr=5e-4, warmup_updates=0, decay_offset=4000)
    assert lr_at(0, cfg) == pytest.approx(5e-4)  # full lr from the first update
    for t in (1, 100, 4000, 100_000):
        assert lr_at(t, cfg) == pytest.approx(5e-4 * math.sqrt(4000 / (4000 + t)))


def test_warmup_inverse_sqrt_matches_fairseq() -> None:
    cfg = OptimConfig(lr=5e-4, warmup_updates=4000, warmup_init_lr=1e-7)
    assert lr_at(0, cfg) == pytest.approx(1e-7)
    assert lr_at(2000, cfg) == pytest.approx(1e-7 + (5e-4 - 1e-7) / 2)
    assert lr_at(4000, cfg) == pytest.approx(5e-4)
    assert lr_at(16000, cfg) == pytest.approx(2.5e-4)


def test_optimizer_is_decoupled_adam() -> None:
    model = tiny_model()
    opt = build_optimizer(model, OptimConfig(weight_decay=0.1), torch.device("cpu"))
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.param_groups[0]["betas"] == (0.9, 0.98) and opt.param_groups[0]["weight_decay"] == 0.1

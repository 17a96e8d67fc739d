"""build_optimizer and set_lr: every hyper-parameter of the config reaches AdamW, on every device kind."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model
from tfx.config import OptimConfig
from tfx.optim.optimizers import build_optimizer, lr_at, set_lr

CFG = OptimConfig(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05, warmup_updates=10, warmup_init_lr=2e-5)


@pytest.mark.parametrize("device", ["cpu", "meta"])  # meta: a device without fused Adam takes the foreach path
def test_optimizer_gets_every_setting_and_every_trainable_parameter(device: str) -> None:
    model = tiny_model()
    model.encoder.layers[0].ffn.fc1.weight.requires_grad_(False)
    opt = build_optimizer(model, CFG, torch.device(device))
    assert isinstance(opt, torch.optim.AdamW) and len(opt.param_groups) == 1
    group = opt.param_groups[0]
    assert group["lr"] == lr_at(0, CFG) == 2e-5
    assert group["betas"] == (0.8, 0.95) and group["eps"] == 1e-6 and group["weight_decay"] == 0.05
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(group["params"]) == len(trainable)
    assert all(a is b for a, b in zip(group["params"], trainable, strict=True))
    assert (group["fused"], group["foreach"]) == ((True, None) if device == "cpu" else (None, True))


def test_set_lr_sets_every_group() -> None:
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([{"params": [a]}, {"params": [b]}], lr=1.0)
    set_lr(opt, 0.25)
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.25]

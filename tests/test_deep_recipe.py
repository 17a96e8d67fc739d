"""``+experiment=deep`` carries the spike-free lr measured at d 512 (docs/depth.md "Deep at width")."""

from __future__ import annotations

from tests.test_config import load


def test_deep_is_tfixup_adam_without_warmup_at_the_measured_lr() -> None:
    cfg = load(["+experiment=deep"])
    assert (cfg.model.norm, cfg.init.name, cfg.optim.name, cfg.optim.warmup_updates) == ("none", "tfixup", "adam", 0)
    assert (cfg.model.encoder_layers, cfg.model.d_model, cfg.optim.clip_norm) == (200, 512, 0.0)
    assert cfg.optim.lr == 3e-5  # 5e-5 already raises the loss after update 1 at 200+200, d 512
    assert tuple(cfg.optim.betas) == (0.9, 0.98) and cfg.optim.decay_offset == 4000


def test_deep_lr_stays_overridable() -> None:
    assert load(["+experiment=deep", "optim.lr=5e-4"]).optim.lr == 5e-4

"""Admin (Liu et al. 2020): omega from one profiling pass, as Transformer-Clinic computes it."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from torch.nn.functional import layer_norm

from tests.conftest import PAD, tiny_model
from tests.init.test_schemes import toy_batch
from tests.test_train import tiny_cfg
from tfx.checkpoints.load import load_checkpoint
from tfx.init import apply_init
from tfx.model.residual import Admin
from tfx.train import Trainer, train


def var(t: torch.Tensor) -> float:
    return t.double().var(correction=0).item()


def test_omega_is_the_running_cumulative_variance() -> None:
    """Clinic's rule worked through the first sublayers by hand: omega_1 = 1, then
    omega_{i+1} = sqrt(Var[omega_i x_i] + Var[f_i(x_i)]), encoder and decoder counted apart."""
    model = tiny_model("admin", enc=2, dec=2)  # dropout 0: the pass is deterministic
    batch = toy_batch()
    apply_init(model, "admin", seed=3, batch=batch)
    enc, dec = model.encoder, model.decoder
    pad = batch.src_tokens.eq(PAD)
    with torch.no_grad():
        x0 = enc.embedding(batch.src_tokens).masked_fill(pad[..., None], 0.0)
        f0 = enc.layers[0].self_attn(x0, x0, key_padding_mask=pad)
        omega1 = math.sqrt(var(x0) + var(f0))
        x1 = layer_norm(x0 + f0, (32,))
        f1 = enc.layers[0].ffn(x1)
        omega2 = math.sqrt(var(omega1 * x1) + var(f1))
        y0 = dec.embedding(batch.prev_output_tokens)
        g0 = dec.layers[0].self_attn(y0, y0, causal=True)
    assert torch.equal(enc.layers[0].self_attn_block.omega, torch.ones(32))
    torch.testing.assert_close(enc.layers[0].ffn_block.omega, torch.full((32,), omega1))
    torch.testing.assert_close(enc.layers[1].self_attn_block.omega, torch.full((32,), omega2))
    assert torch.equal(dec.layers[0].self_attn_block.omega, torch.ones(32))  # the decoder starts again at 1
    expected = math.sqrt(var(y0) + var(g0))
    torch.testing.assert_close(dec.layers[0].encoder_attn_block.omega, torch.full((32,), expected))


def test_omega_grows_with_depth_and_trains() -> None:
    model = tiny_model("admin", enc=4, dec=4)
    apply_init(model, "admin", batch=toy_batch())
    omegas = [m.omega[0].item() for m in model.encoder.modules() if isinstance(m, Admin)]
    assert omegas[0] == 1.0 and all(b > a for a, b in zip(omegas, omegas[1:], strict=False))
    assert all(m.omega.requires_grad for m in model.modules() if isinstance(m, Admin))
    assert "encoder.layers.3.ffn_block.omega" in model.state_dict()


def test_admin_needs_a_batch_and_an_admin_model() -> None:
    with pytest.raises(ValueError, match="init.name=admin sets omega from a forward pass"):
        apply_init(tiny_model("admin"), "admin")
    with pytest.raises(ValueError, match="init.name=admin needs model.norm=admin"):
        apply_init(tiny_model("post"), "admin", batch=toy_batch())


def test_resume_keeps_the_saved_omega_and_does_not_profile(tmp_path: Path, monkeypatch) -> None:
    cfg = tiny_cfg(tmp_path, model_kw={"norm": "admin"}, init="admin", max_updates=4)
    train(cfg, tmp_path / "run")
    saved = load_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint_last.pt")["model"]
    omega = saved["encoder.layers.1.self_attn_block.omega"]
    assert omega.std() > 0  # trained away from the profiled constant
    monkeypatch.setattr("tfx.init.admin.profile_omega", lambda *a: pytest.fail("resume profiled again"))
    trainer = Trainer(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, max_updates=5)), tmp_path / "run")
    try:
        assert trainer.state.step == 4
        for key, value in saved.items():
            torch.testing.assert_close(trainer.model.state_dict()[key], value, rtol=0, atol=0, msg=key)
    finally:
        trainer.close()

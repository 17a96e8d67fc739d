from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.conftest import random_batch, tiny_model
from tfx.config import OptimConfig
from tfx.optim.optimizers import OPTIMIZERS, build_optimizer, lr_at, set_lr


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


def test_offset_decay_after_warmup_is_tfixups_schedule() -> None:
    """Warmup 100, then lr * sqrt(4000 / (4000 + t)): at update 550 still 4.7e-4 (inverse-sqrt: 2.1e-4)."""
    cfg = OptimConfig(lr=5e-4, warmup_updates=100, warmup_init_lr=1e-7, offset_decay=True)
    plain = OptimConfig(lr=5e-4, warmup_updates=100, warmup_init_lr=1e-7)
    for t in (0, 50, 99):
        assert lr_at(t, cfg) == lr_at(t, plain)  # the same warmup
    assert lr_at(550, cfg) == pytest.approx(5e-4 * math.sqrt(4000 / 4550))
    assert lr_at(550, cfg) == pytest.approx(4.69e-4, abs=5e-7)
    assert lr_at(550, plain) == pytest.approx(2.13e-4, abs=5e-7)


def test_optimizer_is_decoupled_adam() -> None:
    model = tiny_model()
    opt = build_optimizer(model, OptimConfig(weight_decay=0.1), torch.device("cpu"))
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.param_groups[0]["betas"] == (0.9, 0.98) and opt.param_groups[0]["weight_decay"] == 0.1


def test_cpu_optimizer_is_fused_and_matches_the_per_tensor_update() -> None:
    """The fused CPU kernel must take the same AdamW steps as torch's plain for-loop implementation."""
    torch.manual_seed(0)
    model, reference = tiny_model(), tiny_model()
    reference.load_state_dict(model.state_dict())
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    fused = build_optimizer(model, OptimConfig(lr=1e-3, weight_decay=0.1), torch.device("cpu"))
    assert fused.defaults["fused"] is True
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.1, foreach=False)
    src, tgt = random_batch()
    for _ in range(3):
        for m, opt in ((model, fused), (reference, plain)):
            opt.zero_grad()
            m(src, tgt).pow(2).mean().backward()
            opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        if name.endswith("k_proj.bias"):
            continue  # its true gradient is 0 (softmax ignores a per-query shift): Adam amplifies rounding noise
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.equal(
        model.state_dict()["encoder.layers.0.ffn.fc1.weight"], initial["encoder.layers.0.ffn.fc1.weight"]
    )


def reference_radam_step(p: torch.Tensor, grad: torch.Tensor, state: dict, lr: float, wd: float) -> None:
    """The update rule of layer6ai-labs/T-Fixup fairseq/optim/adam.py ``Adam.step`` (its RAdam branch),
    written out independently from torch's implementation, in float64."""
    beta1, beta2, eps = 0.9, 0.98, 1e-8
    state["step"] += 1
    t = state["step"]
    state["v"] = beta2 * state["v"] + (1 - beta2) * grad * grad
    state["m"] = beta1 * state["m"] + (1 - beta1) * grad
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * t * beta2**t / (1 - beta2**t)
    p -= wd * lr * p  # decoupled decay with the scheduled lr, in both branches
    if rho_t >= 5:
        rect = (1 - beta2**t) * (rho_t - 4) / (rho_inf - 4) * (rho_t - 2) / rho_t * rho_inf / (rho_inf - 2)
        p -= lr * math.sqrt(rect) / (1 - beta1**t) * state["m"] / (state["v"].sqrt() + eps)
    else:
        p -= lr / (1 - beta1**t) * state["m"]


def test_radam_takes_the_reference_codes_steps() -> None:
    """tfx's radam (torch.optim.RAdam, decoupled decay) against the reference rule for the first 10 steps,
    across the switch from momentum SGD (t <= 5) to rectified steps (t >= 6), with the scheduled lr."""
    cfg = OptimConfig(name="radam", lr=5e-2, weight_decay=0.1, warmup_updates=0, decay_offset=4)
    g = torch.Generator().manual_seed(0)
    start = torch.randn(4, 3, generator=g, dtype=torch.float64)
    weight = nn.Parameter(start.clone())
    opt = build_optimizer(nn.ParameterList([weight]), cfg, torch.device("cpu"))
    assert isinstance(opt, torch.optim.RAdam) and opt.defaults["decoupled_weight_decay"]
    expected, state = start.clone(), {"step": 0, "m": torch.zeros_like(start), "v": torch.zeros_like(start)}
    for step in range(10):
        grad = torch.randn(4, 3, generator=g, dtype=torch.float64) * (1 + step)
        set_lr(opt, lr_at(step, cfg))
        weight.grad = grad.clone()
        opt.step()
        reference_radam_step(expected, grad, state, lr_at(step, cfg), cfg.weight_decay)
        torch.testing.assert_close(weight.detach(), expected, rtol=1e-12, atol=1e-12, msg=f"step {step + 1}")
    assert not torch.allclose(expected, start)


def test_radam_rectification_seen_in_torchs_steps() -> None:
    """With a constant gradient, m_hat = g and v_hat = g^2, so a step moves p by lr * (1 or r_t) * sign(g):
    the first 5 steps are momentum SGD scaled by |g| (no second moment), then r_t ramps to 1."""
    lr, g = 1e-3, 3.0
    weight = nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = build_optimizer(nn.ParameterList([weight]), OptimConfig(name="radam", lr=lr, weight_decay=0.0),
                          torch.device("cpu"))  # fmt: skip
    moves = []
    for _ in range(200):
        before = weight.item()
        weight.grad = torch.full_like(weight, g)
        opt.step()
        moves.append((before - weight.item()) / lr)
    assert moves[:5] == pytest.approx([g] * 5)  # un-normalized: proportional to the gradient
    observed = {t: moves[t - 1] for t in (6, 20, 100, 200)}
    assert observed == pytest.approx({6: 0.1155, 20: 0.3750, 100: 0.8197, 200: 0.9608}, abs=1e-4)


def test_optimizer_registry_is_the_config_check() -> None:
    assert set(OPTIMIZERS) == {"adam", "radam"}
    with pytest.raises(ValueError, match=r"optim.name='sgd': use one of \('adam', 'radam'\)"):
        OptimConfig(name="sgd")
    model = tiny_model()
    assert isinstance(build_optimizer(model, OptimConfig(name="adam"), torch.device("cpu")), torch.optim.AdamW)
    assert isinstance(build_optimizer(model, OptimConfig(name="radam"), torch.device("cpu")), torch.optim.RAdam)


@pytest.mark.slow
def test_radam_trains_the_toy_task(tmp_path) -> None:
    from tfx.config import Config, DataConfig, ModelConfig, TrainConfig
    from tfx.train import train

    data = DataConfig(source="toy", toy_train_size=400, toy_valid_size=16, toy_test_size=16, vocab_size=64,
                      cache_dir=str(tmp_path / "cache"), max_tokens=300)  # fmt: skip
    model = ModelConfig(encoder_layers=2, decoder_layers=2, d_model=32, ffn_dim=64, heads=4, dropout=0.1,
                        attention_dropout=0.0, activation_dropout=0.0, max_positions=64)  # fmt: skip
    run = TrainConfig(device="cpu", max_updates=60, progress=False, save_every_epochs=0, valid_max_sentences=8,
                      threads=1, layer_stats_every_updates=0)  # fmt: skip
    optim = OptimConfig(name="radam", lr=2e-3, clip_norm=25.0)
    summary = train(Config(data=data, model=model, optim=optim, train=run), tmp_path / "run")
    losses = summary["losses"]
    assert summary["step"] == 60 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5

"""Precision: autocast dtype choice, fp16 loss scaling (overflow skipped, scale halved, clip unscaled), resume."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

import tfx.training.step as step_mod
from tests.conftest import random_batch, tiny_model
from tests.test_train import tiny_cfg
from tfx.checkpoints.load import load_checkpoint
from tfx.config import OptimConfig
from tfx.optim.loss import label_smoothed_loss
from tfx.optim.optimizers import build_optimizer
from tfx.runtime.precision import (
    CPU_BF16_ENV,
    CPU_BF16_TRACE_ENV,
    MIN_LOSS_SCALE,
    Precision,
    PrecisionError,
    autocast_dtype,
    cpu_has_native_bf16,
    use_bf16,
)
from tfx.train import train

CPU = torch.device("cpu")
INIT_SCALE = 2.0**16  # GradScaler's default
SCALE = 256.0  # the untrained tiny model's fp16 gradients genuinely overflow at 65536


def fp16(scale: float = SCALE) -> Precision:
    precision = Precision("fp16", CPU)
    precision.load_state_dict({**precision.state_dict(), "scale": scale})
    return precision


def test_precision_auto_keeps_cpus_without_native_bf16_in_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)
    assert use_bf16("auto", CPU) == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert use_bf16("bf16", CPU) and not use_bf16("fp32", CPU) and not use_bf16("fp16", CPU)


@pytest.mark.parametrize(("native", "dtype"), [("1", torch.bfloat16), ("0", None)])
def test_auto_follows_the_forced_cpu_answer_on_any_cpu(monkeypatch: pytest.MonkeyPatch, native: str, dtype) -> None:
    """Both resolutions of ``auto`` on this machine, whatever its CPU: bf16-native and not."""
    monkeypatch.setenv(CPU_BF16_ENV, native)
    assert cpu_has_native_bf16() is (native == "1")
    assert autocast_dtype("auto", CPU) is dtype and Precision("auto", CPU).name == ("bf16" if dtype else "fp32")
    assert autocast_dtype("fp32", CPU) is None and autocast_dtype("bf16", CPU) is torch.bfloat16  # explicit wins


def test_a_bad_forced_cpu_answer_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CPU_BF16_ENV, "yes")
    with pytest.raises(PrecisionError, match=f"{CPU_BF16_ENV}='yes': use 1 .*, 0, or unset it"):
        use_bf16("auto", CPU)


def test_autocast_dtype_and_scaler_per_precision() -> None:
    assert autocast_dtype("fp16", CPU) is torch.float16 and autocast_dtype("fp32", CPU) is None
    assert autocast_dtype("bf16", CPU) is torch.bfloat16
    assert Precision("fp16", CPU).scaling and Precision("fp16", CPU).loss_scale == INIT_SCALE
    for name in ("fp32", "bf16"):
        p = Precision(name, CPU)
        assert p.name == name and not p.scaling and p.loss_scale == 1.0 and p.state_dict() == {}


def _model_and_grads(precision: Precision, seed: int = 0):
    """A tiny Transformer with the fused AdamW the trainer uses, after one fp16-autocast backward."""
    torch.manual_seed(seed)
    model = tiny_model()
    optimizer = build_optimizer(model, OptimConfig(lr=1e-3), CPU)
    src, tgt = random_batch()
    with precision.autocast():
        logits = model(src, tgt)
    loss, _ = label_smoothed_loss(logits, tgt, 0.1, 0)
    precision.backward(loss / tgt.numel())
    return model, optimizer


def test_clipping_sees_unscaled_gradients() -> None:
    """The returned norm is the true one (not 65536x), and clipping to 0.5 leaves true gradients of norm 0.5."""
    reference, _ = _model_and_grads(Precision("fp32", CPU))
    true_norm = float(torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()]))
    precision = fp16()
    model, optimizer = _model_and_grads(precision)
    scaled_norm = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
    assert scaled_norm == pytest.approx(SCALE * true_norm, rel=0.02)
    grad_norm = precision.unscale_and_clip(optimizer, model.parameters(), max_norm=0.5)
    assert grad_norm == pytest.approx(true_norm, rel=0.02) and true_norm > 0.5
    clipped = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
    assert clipped == pytest.approx(0.5, rel=1e-3)


def test_overflow_skips_the_update_halves_the_scale_then_recovers() -> None:
    precision = fp16()
    model, optimizer = _model_and_grads(precision)
    before = [p.detach().clone() for p in model.parameters()]
    next(model.parameters()).grad[0, 0] = math.inf  # the scaled gradient overflowed
    grad_norm = precision.unscale_and_clip(optimizer, model.parameters(), max_norm=math.inf)
    outcome = precision.step(optimizer, grad_norm, loss_finite=True)
    assert outcome.overflow and not outcome.applied and not math.isfinite(outcome.grad_norm)
    assert precision.loss_scale == SCALE / 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # weights untouched
    assert all(not s or float(s["step"]) == 0 for s in optimizer.state.values())  # Adam's step count too
    optimizer.zero_grad(set_to_none=True)
    model2, _ = _model_and_grads(precision)  # a clean backward at the lowered scale
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        p.grad = q.grad
    outcome = precision.step(optimizer, precision.unscale_and_clip(optimizer, model.parameters(), math.inf), True)
    assert outcome.applied and not outcome.overflow and precision.loss_scale == SCALE / 2
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_fp16_update_equals_the_update_from_the_unscaled_gradients() -> None:
    """Fused AdamW sees each gradient divided by the scale exactly once (its moments show it; its step would not)."""
    torch.manual_seed(0)
    plain, scaled = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    scaled.load_state_dict(plain.state_dict())
    grads = [torch.randn_like(p) for p in plain.parameters()]
    opt_plain, opt_scaled = (build_optimizer(m, OptimConfig(), CPU) for m in (plain, scaled))
    for p, g in zip(plain.parameters(), grads, strict=True):
        p.grad = g.clone()
    opt_plain.step()
    precision = fp16()
    precision.backward(sum((p * g).sum() for p, g in zip(scaled.parameters(), grads, strict=True)))  # grad = SCALE*g
    norm = precision.unscale_and_clip(opt_scaled, scaled.parameters(), math.inf)
    assert precision.step(opt_scaled, norm, loss_finite=True).applied
    for p, q in zip(plain.parameters(), scaled.parameters(), strict=True):
        torch.testing.assert_close(opt_scaled.state[q]["exp_avg"], opt_plain.state[p]["exp_avg"])
        torch.testing.assert_close(q, p)


def test_non_finite_loss_or_a_vanishing_scale_is_not_an_overflow() -> None:
    precision = fp16()
    model, optimizer = _model_and_grads(precision)
    next(model.parameters()).grad[0, 0] = math.nan
    outcome = precision.step(optimizer, precision.unscale_and_clip(optimizer, model.parameters(), 1.0), False)
    assert not outcome.applied and not outcome.overflow  # the forward pass itself diverged
    precision.load_state_dict({**precision.state_dict(), "scale": MIN_LOSS_SCALE})
    model, optimizer = _model_and_grads(precision)
    next(model.parameters()).grad[0, 0] = math.inf
    outcome = precision.step(optimizer, precision.unscale_and_clip(optimizer, model.parameters(), 1.0), True)
    assert not outcome.overflow and precision.loss_scale < MIN_LOSS_SCALE  # inf at any scale: divergence


def test_scaler_state_round_trips_and_tolerates_checkpoints_without_it() -> None:
    a = Precision("fp16", CPU)
    a.load_state_dict({**a.state_dict(), "scale": 1024.0, "_growth_tracker": 7})
    b = Precision("fp16", CPU)
    b.load_state_dict(a.state_dict())
    assert b.loss_scale == 1024.0 and b.state_dict()["_growth_tracker"] == 7
    b.load_state_dict({})  # a bf16/fp32 run's checkpoint: keep the scale
    assert b.loss_scale == 1024.0
    Precision("bf16", CPU).load_state_dict(a.state_dict())  # an fp16 checkpoint resumed in bf16: ignored


OVERFLOWS = 3


def _overflow_first_steps(monkeypatch: pytest.MonkeyPatch, n: int = OVERFLOWS) -> None:
    """Multiply the first ``n`` losses by 1e6: finite in fp32, but their fp16 gradients overflow (inf)."""
    real, calls = step_mod.label_smoothed_loss, [0]

    def overflowing(*args, **kwargs):
        calls[0] += 1
        loss, nll = real(*args, **kwargs)
        return (loss * 1e6 if calls[0] <= n else loss), nll

    monkeypatch.setattr(step_mod, "label_smoothed_loss", overflowing)


def test_fp16_training_skips_overflows_without_counting_them_as_divergence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _overflow_first_steps(monkeypatch)
    cfg = tiny_cfg(tmp_path, precision="fp16", max_updates=16, max_bad_steps=2, log_every_updates=1)
    summary = train(cfg, tmp_path / "run")  # 3 overflows in a row, yet max_bad_steps=2 does not stop it
    assert summary["step"] == 16 and len(summary["losses"]) == 16 + OVERFLOWS
    later = summary["losses"][OVERFLOWS:]
    assert all(math.isfinite(x) for x in later) and sum(later[-4:]) < sum(later[:4])
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoints" / "checkpoint_last.pt")
    state = ckpt["train_state"]
    assert (state["overflow_steps"], state["skipped_steps"], state["bad_steps"]) == (OVERFLOWS, 0, 0)
    assert ckpt["scaler"]["scale"] == INIT_SCALE / 2**OVERFLOWS
    acc = EventAccumulator(str(tmp_path / "run" / "tb"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("train/loss_scale")][-1] == INIT_SCALE / 2**OVERFLOWS
    assert [e.value for e in acc.Scalars("train/overflow_steps")][-1] == OVERFLOWS


def test_fp16_resume_restores_the_loss_scale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _overflow_first_steps(monkeypatch)
    train(tiny_cfg(tmp_path, precision="fp16", max_updates=4), tmp_path / "run")
    scales: list[float] = []
    resumed = train(
        tiny_cfg(tmp_path, precision="fp16", max_updates=8),
        tmp_path / "run",
        on_update=lambda trainer, metrics: scales.append(metrics["train/loss_scale"]),
    )
    assert resumed["step"] == 8 and scales == [INIT_SCALE / 2**OVERFLOWS] * 4  # not back at 65536


def test_asking_the_cpus_answer_is_traced_for_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI's flipped pass runs the tests whose runs ask the CPU's bf16 answer (tests/precision_auto_tests.txt): each
    ask appends a line to the trace file, a pinned precision asks nothing (CPU, fp32 and auto)."""
    trace = tmp_path / "trace"
    monkeypatch.setenv(CPU_BF16_TRACE_ENV, str(trace))
    assert not use_bf16("fp32", CPU) and not trace.exists()
    use_bf16("auto", CPU)
    use_bf16("auto", CPU)
    assert trace.read_text().splitlines() == [str(os.getpid())] * 2

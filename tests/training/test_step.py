"""An ordinary update reads nothing on the host: ``Stepper.update`` under a guard that fails on every way a
tensor reaches Python (``.item()``, ``.tolist()``, ``float()``, ``int()``, ``bool()``, ``.cpu()``,
``.numpy()``), and a run that reads its updates once per ``log_every_updates``. CPU, fp32 and fp16
(loss scaling), fused AdamW; on CUDA, ``tests/test_gpu.py`` runs the same step under torch's sync-debug mode."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import tfx.training.step as step_mod
from tests.conftest import random_batch, tiny_model
from tests.test_train import tiny_cfg
from tfx.config import OptimConfig
from tfx.data import Batch
from tfx.optim.optimizers import build_optimizer
from tfx.runtime.precision import Precision
from tfx.train import train
from tfx.training.step import Stepper, read

CPU = torch.device("cpu")
HOST_READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy")


class HostRead(AssertionError):
    pass


@contextlib.contextmanager
def no_host_reads() -> Iterator[None]:
    """Every host read of a tensor inside the block raises ``HostRead``, naming the method."""
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def refuse(name: str):
        def method(self, *args, **kwargs):
            raise HostRead(f"Tensor.{name}() read a tensor on the host during an ordinary update")

        return method

    for name in HOST_READS:
        setattr(torch.Tensor, name, refuse(name))
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def _batch(seed: int = 0) -> Batch:
    src, prev = random_batch(seed=seed)
    target = torch.roll(prev, -1, 1)
    return Batch(src, (src != 0).sum(1), prev, target, int((target != 0).sum()), list(range(len(src))))


@pytest.mark.parametrize(("precision", "clip"), [("fp32", 0.0), ("fp32", 0.5), ("fp16", 0.5)])
def test_an_update_reads_no_tensor_on_the_host(precision: str, clip: float) -> None:
    model = tiny_model()
    opt = OptimConfig(clip_norm=clip)
    scaled = Precision(precision, CPU)
    if scaled.scaling:  # below the scale at which the untrained tiny model's fp16 gradients overflow
        scaled.load_state_dict({**scaled.state_dict(), "scale": 256.0})
    stepper = Stepper(model, model, build_optimizer(model, opt, CPU), scaled, opt, CPU, 1)
    batches = [_batch(i) for i in range(3)]
    with no_host_reads():
        pending = [stepper.update([b], lr=1e-3) for b in batches]
    (first, *_) = read(pending)  # the one read, afterwards
    assert first["applied"] == 1.0 and math.isfinite(first["loss"]) and first["ntokens"] == _batch(0).ntokens


def test_the_guard_catches_a_host_read() -> None:
    with no_host_reads(), pytest.raises(HostRead, match=r"Tensor.item\(\)"):
        torch.ones(()).item()
    with no_host_reads(), pytest.raises(HostRead, match="__bool__"):
        bool(torch.ones(()) > 0)


def test_a_non_finite_update_is_skipped_on_the_device() -> None:
    """NaN gradients: fused AdamW's found_inf leaves weights, moments and step count alone, no host read."""
    model = tiny_model()
    opt = OptimConfig()
    optimizer = build_optimizer(model, opt, CPU)
    stepper = Stepper(model, model, optimizer, Precision("fp32", CPU), opt, CPU, 1)
    before = [p.detach().clone() for p in model.parameters()]
    real = step_mod.label_smoothed_loss
    step_mod.label_smoothed_loss = lambda *a, **k: tuple(x * float("nan") for x in real(*a, **k))
    batch = _batch()
    try:
        with no_host_reads():
            pending = stepper.update([batch], lr=1e-3)
    finally:
        step_mod.label_smoothed_loss = real
    (result,) = read([pending])
    assert result["applied"] == 0.0 and not math.isfinite(result["grad_norm"])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(float(s["step"]) == 0 for s in optimizer.state.values())


def test_a_run_reads_its_updates_once_per_log_interval_and_trains_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropout 0: the CPU dropout mask draws its seed from torch's CPU generator (a CPU tensor read on the
    CPU: there is no device to wait for, and CUDA uses torch's own dropout)."""
    quiet = {"layer_stats_every_updates": 0, "max_updates": 12, "validate_every_updates": 0}
    cfg = lambda log_every: tiny_cfg(tmp_path, None, {"dropout": 0.0}, log_every_updates=log_every, **quiet)  # noqa: E731
    every = train(cfg(1), tmp_path / "every")["losses"]
    reads: list[int] = []
    real_read, real_update = step_mod.read, Stepper.update

    def counted(pending):
        reads.append(len(pending))
        return real_read(pending)

    def guarded(self, *args, **kwargs):
        with no_host_reads():
            return real_update(self, *args, **kwargs)

    monkeypatch.setattr("tfx.training.pending.read", counted)
    monkeypatch.setattr(Stepper, "update", guarded)
    deferred = train(cfg(4), tmp_path / "deferred")["losses"]
    assert reads == [4, 4, 4]  # one read per 4 updates; none inside an update
    assert deferred == every  # reading later changes nothing

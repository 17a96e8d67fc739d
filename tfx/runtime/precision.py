"""Mixed precision for the training step: the autocast dtype and, for fp16, dynamic loss scaling.

``train.precision``:

- ``fp32``: no autocast.
- ``bf16``: bf16 autocast. bf16 has fp32's exponent range, so gradients need no scaling.
- ``fp16``: fp16 autocast with ``torch.amp.GradScaler``, for GPUs without bf16 (V100, T4). fp16
  tops out at 65504 and flushes gradients below ~6e-8 to zero, so the loss is multiplied by a
  scale before backward and the gradients divided by it before clipping and the update. When
  the scaled gradients overflow (inf/NaN) the update is skipped and the scale halved; after
  ``growth_interval`` (2000) clean updates it doubles. Same policy as fairseq's
  ``DynamicLossScaler``, which the T-Fixup reference trained its deep models with.
- ``auto``: bf16 where it is native (CUDA with bf16, CPUs with AVX512-BF16/AMX), else fp32.
  ``TFX_CPU_NATIVE_BF16=1`` (or ``0``) overrides the CPU's answer: to check on an AVX2 machine what
  ``auto`` does on a bf16-native one (the test suite runs that way in CI), or to keep such a CPU in fp32.

An overflow is not divergence: it is the scaler finding its range, so the trainer counts it
apart (``train/overflow_steps``) and not toward ``train.max_bad_steps``. It is divergence when
the loss itself is not finite (loss scaling cannot fix a forward pass that overflows), or when
gradients still overflow at a scale below ``MIN_LOSS_SCALE`` (fairseq's ``--min-loss-scale``).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

MIN_LOSS_SCALE = 1e-4  # fairseq's default --min-loss-scale: overflowing below it means the gradients are inf
CPU_BF16_ENV = "TFX_CPU_NATIVE_BF16"  # 1 / 0: what ``auto`` takes the CPU's bf16 support to be
# a file each process appends a line to when it asks the CPU's bf16 answer: tests/conftest.py learns which tests
# depend on it, the only ones CI's pass with the other answer runs (tests/precision_auto_tests.txt)
CPU_BF16_TRACE_ENV = "TFX_TRACE_CPU_BF16"


class PrecisionError(ValueError):
    """A precision setting that cannot be honoured (one line for the user)."""


def cpu_has_native_bf16() -> bool:
    """Whether the CPU runs bf16 matmuls natively (AVX512-BF16/AMX), unless ``TFX_CPU_NATIVE_BF16`` says."""
    if trace := os.environ.get(CPU_BF16_TRACE_ENV):
        with open(trace, "a") as asked:
            asked.write(f"{os.getpid()}\n")
    forced = os.environ.get(CPU_BF16_ENV)
    if forced is None or forced == "":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if forced not in ("0", "1"):
        raise PrecisionError(f"{CPU_BF16_ENV}={forced!r}: use 1 (treat the CPU as bf16-native), 0, or unset it")
    return forced == "1"


def use_bf16(precision: str, device: torch.device) -> bool:
    """``auto``: bf16 on CUDA, and on CPUs with native bf16 matmuls (AVX512-BF16/AMX).

    Without native support oneDNN emulates bf16 and is ~100x *slower* than fp32
    (measured on an AVX2-only AMD EPYC), so ``auto`` keeps such CPUs in fp32.
    """
    if precision != "auto":
        return precision == "bf16"
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return cpu_has_native_bf16()


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The dtype the forward pass autocasts to; None for fp32."""
    if precision == "fp16":
        return torch.float16
    return torch.bfloat16 if use_bf16(precision, device) else None


@dataclass(frozen=True)
class StepOutcome:
    """What one update did: 0-d device tensors straight from ``Precision.step`` (reading them syncs), or
    plain numbers once the trainer has read them."""

    grad_norm: torch.Tensor | float  # of the unscaled gradients, before clipping (inf/NaN on a bad step)
    applied: torch.Tensor | bool  # the optimizer stepped
    overflow: torch.Tensor | bool  # fp16: skipped because the scaled gradients overflowed; the scale was lowered


def step_unless(optimizer: torch.optim.Optimizer, skip: torch.Tensor) -> None:
    """``optimizer.step()`` unless ``skip`` (a 0-d bool tensor), decided on the device where it can be.

    Fused Adam takes a ``found_inf`` tensor and, when it is non-zero, leaves the weights, moments and
    step count as they were (the hook ``GradScaler`` uses): no host sync. Other optimizers (foreach
    RAdam) have no such input, so the host reads ``skip`` (one sync per update).
    """
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer.found_inf = skip.to(torch.float32)
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
    elif not bool(skip):
        optimizer.step()


class Precision:
    """Autocast + loss scaling for one device; ``train_step`` calls only this for precision."""

    def __init__(self, precision: str, device: torch.device) -> None:
        self.device = device
        self.dtype = autocast_dtype(precision, device)
        # Disabled (a pass-through) unless fp16; its state_dict is then empty.
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype is torch.float16)

    @property
    def name(self) -> str:
        return {torch.bfloat16: "bf16", torch.float16: "fp16", None: "fp32"}[self.dtype]

    @property
    def bf16(self) -> bool:
        return self.dtype is torch.bfloat16

    @property
    def scaling(self) -> bool:
        return self.scaler.is_enabled()

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale_and_clip(
        self, optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor], max_norm: float
    ) -> torch.Tensor:
        """Divide the gradients by the loss scale (first, so the clip threshold means what it says), then clip.

        Returns the total norm before clipping as a 0-d tensor on the device (non-finite on overflow;
        nothing is read on the host). ``max_norm=inf`` computes the norm only: clipping would multiply
        every gradient by 1. Under FSDP the gradients are ``DTensor`` shards: the norm is reduced over
        all of them (the global norm, the same on every rank), and so is the scaler's "found inf"
        (torch's DTensor takes the max over ranks), so every rank skips an update that overflowed in
        any shard.
        """
        self.scaler.unscale_(optimizer)  # a no-op when disabled
        params = [p for p in params if p.grad is not None]
        if math.isinf(max_norm):
            norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        full = getattr(norm, "full_tensor", None)  # a DTensor under FSDP: the replicated value
        return full() if full is not None else norm

    def step(
        self, optimizer: torch.optim.Optimizer, grad_norm: torch.Tensor, loss_finite: torch.Tensor | bool
    ) -> StepOutcome:
        """Apply the update unless the gradients are not finite; under fp16 also update the scale.

        Decided on the device (``step_unless``; the scaler's own ``found_inf`` under fp16), so the
        outcome's fields are device tensors: the trainer reads them with the update's metrics.
        """
        grad_norm = torch.as_tensor(grad_norm)
        finite = torch.isfinite(grad_norm)
        if not self.scaling:
            step_unless(optimizer, ~finite)
            return StepOutcome(grad_norm, applied=finite, overflow=torch.zeros_like(finite))
        self.scaler.step(optimizer)  # skips the update itself when unscale_ found inf/NaN
        self.scaler.update()  # halves the scale after an overflow, doubles it after growth_interval clean steps
        in_range = self.scaler._get_scale_async() >= MIN_LOSS_SCALE  # noqa: SLF001 - the scale without a sync
        overflow = ~finite & torch.as_tensor(loss_finite, device=finite.device) & in_range.to(finite.device)
        return StepOutcome(grad_norm, applied=finite, overflow=overflow)

    def scale_tensor(self) -> torch.Tensor | None:
        """The loss scale as a device tensor (read with the metrics); None without fp16."""
        return self.scaler._get_scale_async() if self.scaling else None  # noqa: SLF001

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 without fp16); reading it syncs."""
        return float(self.scaler.get_scale()) if self.scaling else 1.0

    def state_dict(self) -> dict[str, Any]:
        """The scaler's scale and growth tracker (plain numbers; empty without fp16)."""
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the scale; an empty state (a checkpoint saved without fp16) keeps the initial one."""
        if state and self.scaling:
            self.scaler.load_state_dict(state)

"""Dropout whose CPU mask is cheap on every CPU, not only on Intel's.

torch draws a CPU dropout mask with ``bernoulli_``, which takes MKL's vectorised generator only when
the CPU's vendor is Intel; elsewhere (AMD) it calls mt19937 once per element, and dropout was ~5 % of
a CPU update. Here the CPU mask comes from numpy's SFC64 in bulk, 32 random bits per element
(``p`` exact to 2**-32), seeded by one draw from torch's CPU generator: ``torch.manual_seed`` and a
checkpoint's saved RNG state still decide every mask, so seeded runs and resumed runs repeat exactly.
The mask is kept as one byte per element (uint8: multiplying by a bool tensor is ~2x slower) for
backward, where torch keeps a 4-byte float one.
CUDA, and code being traced by ``torch.compile``, use torch's own fused dropout; so does attention
dropout, which ``F.scaled_dot_product_attention`` applies inside its kernel (the iwslt recipes set it to 0).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

_BITS = 2**32


def keep_mask(shape: torch.Size, p: float) -> Tensor:
    """uint8 (``shape``) on CPU: 1 with probability ``1 - p``, else 0."""
    n = int(np.prod(shape, dtype=np.int64))
    seed = int(torch.randint(2**62, (), dtype=torch.int64))  # one draw from torch's default CPU generator
    raw = np.random.SFC64(seed).random_raw((n + 1) // 2)  # uint64: two 32-bit draws each
    bits = raw.view(np.uint32)[:n]
    threshold = np.uint32(min(round(p * _BITS), _BITS - 1))
    return torch.from_numpy(bits >= threshold).view(torch.uint8).view(shape)


class _MaskedScale(torch.autograd.Function):
    """x * keep / (1 - p), with the mask saved as bytes for the backward pass."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout`` with the cheap mask on CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)
    return _MaskedScale.apply(x, keep_mask(x.shape, p), 1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """``nn.Dropout`` (its ``p`` check, attributes and repr) with the cheap CPU mask."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

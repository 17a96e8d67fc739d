"""Derf: Pre-LN with every LayerNorm replaced by Derf(x) = weight * erf(alpha * x + shift) + bias.

Chen, Lu, Zhu, Sun, Liu, "Stronger Normalization-Free Transformers" (arXiv 2512.10938, 2025); reference code
zlab-princeton/Derf, ``ViT/dynamic_erf.py``, whose forward is::

    x = self.alpha * x + self.shift
    x = torch.erf(x)
    x = x * self.weight + self.bias        # channels_last

with ``alpha`` and ``shift`` one learnable scalar each (``torch.ones(1) * alpha_init_value``, 0.5, and
``* shift_init_value``, 0) and ``weight`` 1 and ``bias`` 0 per channel, as a LayerNorm's affine starts.
``convert_ln_to_derf`` swaps every ``nn.LayerNorm`` of a Pre-LN model for one, the stack-final norm included:
here, each sublayer's input norm and each stack's final norm, of both stacks (``model.norm=derf``), as tfx's
DyT does. erf squashes the extreme activations a LayerNorm would scale down, as DyT's tanh does; the paper's
point is that erf's shape and the learnable shift train better than tanh.

What differs from the reference, and why:

- the arithmetic is the reference's channels-last branch; its channels-first branch (conv feature maps,
  ``LayerNorm2d``) has no use on a (B, T, D) stream;
- alpha's init is the ViT reference's 0.5 (``model.norm_options.alpha``), shift's 0
  (``model.norm_options.shift``). The reference's GPT-2 patch (``language model/model_derf.patch``) instead
  starts alpha at 1.0 and multiplies the embeddings by a learnable scalar started at sqrt(d_model); tfx keeps
  the ViT module, its MT models being small encoder-decoders whose embeddings already scale by sqrt(d_model)
  (``TokenEmbedding``), as tfx's DyT keeps DyT's non-LLM module;
- the reference's optimizer (ViT ``optim_factory.py``) exempts 1-D parameters (alpha, shift, weight, bias)
  from weight decay; tfx decays every parameter, as it does LayerNorm's for ``preln`` and DyT's, so that Derf,
  DyT and Pre-LN differ only in the normalizer;
- the surrounding weights start from tfx's Xavier base (``init: xavier``, as Pre-LN and DyT), not the ViT
  recipe's truncated normal; the schedule is conf/method/derf.yaml's (the reference's recipes warm up).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tfx.model.config import require
from tfx.model.residual import Branch, Residual, ResidualContext, residual_kind


@dataclass(frozen=True)
class DerfOptions:
    """Derf's own settings, ``model.norm_options.*``: where every Derf of the model starts."""

    alpha: float = 0.5  # alpha at init (the reference's ``alpha_init_value``)
    shift: float = 0.0  # shift at init (the reference's ``shift_init_value``)

    def __post_init__(self) -> None:
        require(self.alpha > 0, f"model.norm_options.alpha={self.alpha} must be positive")
        require(math.isfinite(self.shift), f"model.norm_options.shift={self.shift} must be finite")


class DynamicErf(nn.Module):
    """weight * erf(alpha * x + shift) + bias over the last dimension; alpha and shift learnable scalars."""

    def __init__(self, d_model: int, alpha: float, shift: float) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), alpha))
        self.shift = nn.Parameter(torch.full((1,), shift))
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * torch.erf(self.alpha * x + self.shift) + self.bias


@residual_kind("derf")
class Derf(Residual):
    """x + dropout(f(Derf(x))): Pre-LN with a ``DynamicErf`` where each LayerNorm was, the stack-final one too."""

    Options = DerfOptions

    def __init__(self, at: ResidualContext, *, alpha: float, shift: float) -> None:
        super().__init__(at)
        self.norm = DynamicErf(at.d_model, alpha, shift)

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return x + self.dropout(branch(self.norm(x)))

    @classmethod
    def final_module(cls, at: ResidualContext, *, alpha: float, shift: float) -> nn.Module:
        return DynamicErf(at.d_model, alpha, shift)

"""Residual connections, one small module per kind: the arithmetic that tells the methods apart.

Every kind wraps a sublayer ``f`` (attention or FFN) with dropout on its output:

- ``none``: x + f(x), no LayerNorm module anywhere (the T-Fixup architecture);
- ``post``: LN(x + f(x)) (Vaswani et al. 2017; fairseq's default);
- ``pre``: x + f(LN(x)), and each stack ends with a LayerNorm (Xiong et al. 2020);
- ``deepnorm``: LN(alpha * x + f(x)), alpha from both stack depths (DeepNet, Wang et al. 2022);
- ``admin``: LN(omega * x + f(x)), omega a learnable vector set by a profiling pass
  (Liu et al. 2020; ``tfx.init.admin``).

``make_residual`` builds one per sublayer; ``RESIDUALS`` is the one list of kinds (``model.norm``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from tfx.model.dropout import Dropout

Branch = Callable[[Tensor], Tensor]
Side = Literal["encoder", "decoder"]


class Residual(nn.Module):
    """x + dropout(f(x)) with no LayerNorm; the base of every kind."""

    final_norm: ClassVar[bool] = False  # the stack ends with a LayerNorm (Pre-LN)

    def __init__(self, d_model: int, dropout: float, side: Side, n_enc: int, n_dec: int) -> None:
        super().__init__()
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return x + self.dropout(branch(x))


class PostLN(Residual):
    """LN(x + dropout(f(x)))."""

    def __init__(self, d_model: int, dropout: float, side: Side, n_enc: int, n_dec: int) -> None:
        super().__init__(d_model, dropout, side, n_enc, n_dec)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return self.norm(x + self.dropout(branch(x)))


class PreLN(PostLN):
    """x + dropout(f(LN(x))); the stack's final LayerNorm normalizes what the last block leaves."""

    final_norm = True

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return x + self.dropout(branch(self.norm(x)))


def deepnorm_alpha(side: Side, n_enc: int, n_dec: int) -> float:
    """DeepNet's skip weight for an encoder-decoder (Wang et al. 2022, Table 1; torchscale):
    encoder 0.81 * (N^4 M)^(1/16), decoder (3M)^(1/4), N encoder and M decoder layers."""
    if side == "encoder":
        return 0.81 * (n_enc**4 * n_dec) ** (1 / 16)
    return (3 * n_dec) ** 0.25


class DeepNorm(PostLN):
    """LN(alpha * x + dropout(f(x))): Post-LN with the skip path up-weighted by a depth constant."""

    def __init__(self, d_model: int, dropout: float, side: Side, n_enc: int, n_dec: int) -> None:
        super().__init__(d_model, dropout, side, n_enc, n_dec)
        self.alpha = deepnorm_alpha(side, n_enc, n_dec)  # a constant of the architecture, not state

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return self.norm(self.alpha * x + self.dropout(branch(x)))


class Admin(PostLN):
    """LN(omega * x + dropout(f(x))), omega trainable (Transformer-Clinic's ``*_ratio_change``).

    omega starts at 1 (plain Post-LN); ``tfx.init.admin`` sets it from a profiling pass, and
    from then on it is a weight like any other, saved and resumed with the state dict.
    """

    def __init__(self, d_model: int, dropout: float, side: Side, n_enc: int, n_dec: int) -> None:
        super().__init__(d_model, dropout, side, n_enc, n_dec)
        self.side = side  # profiling keeps one running variance per stack
        self.omega = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return self.norm(self.omega * x + self.dropout(branch(x)))


# The one registry of residual kinds: tfx.config validates ``model.norm`` against its keys.
RESIDUALS: dict[str, type[Residual]] = {
    "none": Residual,
    "post": PostLN,
    "pre": PreLN,
    "deepnorm": DeepNorm,
    "admin": Admin,
}


def residual_class(kind: str) -> type[Residual]:
    if kind not in RESIDUALS:
        raise ValueError(f"model.norm={kind!r}: use one of {sorted(RESIDUALS)}")
    return RESIDUALS[kind]


def make_residual(kind: str, d_model: int, dropout: float, side: Side, n_enc: int, n_dec: int) -> Residual:
    """The residual connection of one sublayer of a ``side`` stack in an n_enc + n_dec model."""
    return residual_class(kind)(d_model, dropout, side, n_enc, n_dec)


def final_norm(kind: str, d_model: int) -> nn.Module:
    """The stack-final LayerNorm the kind needs (Pre-LN); identity for the others."""
    return nn.LayerNorm(d_model) if residual_class(kind).final_norm else nn.Identity()


def has_layer_norm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.LayerNorm) for m in model.modules())


__all__ = [
    "RESIDUALS",
    "Admin",
    "DeepNorm",
    "PostLN",
    "PreLN",
    "Residual",
    "deepnorm_alpha",
    "final_norm",
    "has_layer_norm",
    "make_residual",
]

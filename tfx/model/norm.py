"""Where LayerNorm sits around a residual branch: a small registry of placements.

Post-LN (Vaswani et al.; fairseq default) normalizes after the residual add; Pre-LN
normalizes the branch input and needs one final LayerNorm per stack; ``none`` is the
T-Fixup architecture, with no LayerNorm module anywhere. A new placement is one
function plus one ``NORM_PLACEMENTS`` entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

Branch = Callable[[Tensor], Tensor]


def _post(x: Tensor, branch: Branch, norm: nn.Module | None, drop: nn.Module) -> Tensor:
    return norm(x + drop(branch(x)))


def _pre(x: Tensor, branch: Branch, norm: nn.Module | None, drop: nn.Module) -> Tensor:
    return x + drop(branch(norm(x)))


def _none(x: Tensor, branch: Branch, norm: nn.Module | None, drop: nn.Module) -> Tensor:
    return x + drop(branch(x))


@dataclass(frozen=True)
class Placement:
    """How one residual block combines branch, dropout and (optionally) LayerNorm."""

    apply: Callable[[Tensor, Branch, nn.Module | None, nn.Module], Tensor]
    block_norm: bool  # each residual block owns a LayerNorm
    final_norm: bool  # each stack ends with a LayerNorm (Pre-LN)


NORM_PLACEMENTS: dict[str, Placement] = {
    "post": Placement(_post, block_norm=True, final_norm=False),
    "pre": Placement(_pre, block_norm=True, final_norm=True),
    "none": Placement(_none, block_norm=False, final_norm=False),
}


def get_placement(name: str) -> Placement:
    if name not in NORM_PLACEMENTS:
        raise ValueError(f"model.norm={name!r}: use one of {sorted(NORM_PLACEMENTS)}")
    return NORM_PLACEMENTS[name]


class Residual(nn.Module):
    """``x + dropout(branch(x))`` with LayerNorm placed as the model's ``norm`` says."""

    def __init__(self, d_model: int, norm: str, dropout: float) -> None:
        super().__init__()
        self.placement = get_placement(norm)
        # With norm="none" no LayerNorm module exists at all (T-Fixup checks this).
        self.norm = nn.LayerNorm(d_model) if self.placement.block_norm else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return self.placement.apply(x, branch, self.norm, self.dropout)


def final_norm(d_model: int, norm: str) -> nn.Module:
    """The stack-final LayerNorm Pre-LN needs; identity for the other placements."""
    return nn.LayerNorm(d_model) if get_placement(norm).final_norm else nn.Identity()


def has_layer_norm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.LayerNorm) for m in model.modules())


__all__ = ["NORM_PLACEMENTS", "Placement", "Residual", "final_norm", "get_placement", "has_layer_norm"]

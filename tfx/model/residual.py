"""Residual connections, one small module per kind: the arithmetic that tells the methods apart.

Every kind wraps a sublayer ``f`` (attention or FFN) with dropout on its output:

- ``none``: x + f(x), no LayerNorm module anywhere (the T-Fixup architecture);
- ``post``: LN(x + f(x)) (Vaswani et al. 2017; fairseq's default);
- ``pre``: x + f(LN(x)), and each stack ends with a LayerNorm (Xiong et al. 2020);
- ``deepnorm``: LN(alpha * x + f(x)), alpha from both stack depths (DeepNet, Wang et al. 2022);
- ``admin``: LN(omega * x + f(x)), omega a learnable vector set by a profiling pass
  (Liu et al. 2020; ``tfx.init.admin``);
- ``dyt``: x + f(DyT(x)), Pre-LN with every LayerNorm, the stack-final one included, replaced by
  DyT(x) = weight * tanh(alpha * x) + bias, alpha one learnable scalar (Zhu et al. 2025);
- ``rezero``: x + resweight * f(x), no LayerNorm, one scalar resweight per layer, 0 at init and
  shared by the layer's sublayers (Bachlechner et al. 2020);
- ``fixup``: x + scale * f(x - shift), no LayerNorm, a learnable scalar bias and multiplier per
  sublayer (Zhang et al. 2019, as its authors' fairseq code applies it to the Transformer).

The kinds added since live one file each in ``tfx/model/kinds/`` (Derf), which ``tfx.model`` imports whole.

``make_residual(cfg, at)`` builds one per sublayer from the model's ``ModelConfig`` and a ``ResidualContext``
(where the connection sits: side, layer, both stack depths, width and dropout). A kind is registered by
``@residual_kind(NAME)`` on its own class, which adds it to ``RESIDUALS`` (what ``model.norm`` may be); a kind
outside tfx registers the same way from a module named in the config's ``plugins``. A kind's own settings are
declared by the kind, as the fields (with defaults) of its ``Options`` dataclass; the config carries them as
``model.norm_options`` (checked against ``Options`` and filled with its defaults by ``ModelConfig``), so a kind
with a setting needs no ``ModelConfig`` field. Its constructor and ``final_module`` take each as a keyword
argument, read from the config by ``make_residual`` and from nowhere else. DyT's ``dyt_alpha`` and ReZero's
``rezero_shared`` predate ``norm_options`` and stay ``ModelConfig`` fields (commands and checkpoints name them):
those two kinds name them in ``config_fields``. A kind's stack-final module is ``final_module`` (a LayerNorm for
Pre-LN); a kind whose sublayers share state within one layer (ReZero) ties it in ``share_within_layer``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor, nn

from tfx.model.config import ModelConfig
from tfx.model.dropout import Dropout
from tfx.model.registry import RESIDUALS, residual_kind
from tfx.model.registry import residual_class as _registered

Branch = Callable[[Tensor], Tensor]
Side = Literal["encoder", "decoder"]


@dataclass(frozen=True)
class ResidualContext:
    """Where one residual connection sits in the model: what a kind may scale or tie by.

    DeepNorm's skip weight reads the side and both depths; a depth-scaled kind (T-Fixup-style) would read
    ``layer`` too. A kind's own settings are not here: they are its ``Options`` (``model.norm_options``).
    """

    side: Side
    layer: int  # index within its stack, 0 nearest the embeddings; the stack's depth for its final module
    n_enc: int  # encoder layers N
    n_dec: int  # decoder layers M
    d_model: int  # the residual stream's width
    dropout: float  # dropout on the branch output

    @classmethod
    def of(cls, cfg: ModelConfig, side: Side, layer: int) -> ResidualContext:
        """The context of layer ``layer`` of the ``side`` stack of the model ``cfg`` describes."""
        return cls(side, layer, cfg.encoder_layers, cfg.decoder_layers, cfg.d_model, cfg.dropout)

    @property
    def depth(self) -> int:
        """The number of layers in this connection's own stack."""
        return self.n_enc if self.side == "encoder" else self.n_dec


@residual_kind("none")
class Residual(nn.Module):
    """x + dropout(f(x)) with no LayerNorm; the base of every kind."""

    # this kind's own settings: a dataclass whose fields, each with its default, are what ``model.norm_options``
    # may set (``tfx.model.registry.resolve_options`` checks and fills them); None: it has none
    Options: ClassVar[type | None] = None
    # the ``ModelConfig`` fields this kind reads (``dyt_alpha``, ``rezero_shared``: settings from before
    # ``norm_options``; a new kind declares ``Options`` instead)
    config_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, at: ResidualContext) -> None:
        super().__init__()
        self.dropout = Dropout(at.dropout)

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return x + self.dropout(branch(x))

    @classmethod
    def final_module(cls, at: ResidualContext, **options: Any) -> nn.Module:
        """What each stack applies to its last layer's output (``at.layer`` is the stack's depth): nothing here;
        a LayerNorm for Pre-LN. ``options``: the kind's settings from the config, as its constructor gets them."""
        return nn.Identity()

    @classmethod
    def share_within_layer(cls, blocks: Sequence[Residual]) -> None:
        """Tie state that the sublayers of one layer share (ReZero's resweight); most kinds share none."""


@residual_kind("post")
class PostLN(Residual):
    """LN(x + dropout(f(x)))."""

    def __init__(self, at: ResidualContext) -> None:
        super().__init__(at)
        self.norm = nn.LayerNorm(at.d_model)

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return self.norm(x + self.dropout(branch(x)))


@residual_kind("pre")
class PreLN(PostLN):
    """x + dropout(f(LN(x))); the stack's final LayerNorm normalizes what the last block leaves."""

    @classmethod
    def final_module(cls, at: ResidualContext, **options: Any) -> nn.Module:
        return nn.LayerNorm(at.d_model)

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return x + self.dropout(branch(self.norm(x)))


def deepnorm_alpha(side: Side, n_enc: int, n_dec: int) -> float:
    """DeepNet's skip weight for an encoder-decoder (Wang et al. 2022, Table 1; torchscale):
    encoder 0.81 * (N^4 M)^(1/16), decoder (3M)^(1/4), N encoder and M decoder layers."""
    if side == "encoder":
        return 0.81 * (n_enc**4 * n_dec) ** (1 / 16)
    return (3 * n_dec) ** 0.25


@residual_kind("deepnorm")
class DeepNorm(PostLN):
    """LN(alpha * x + dropout(f(x))): Post-LN with the skip path up-weighted by a depth constant."""

    def __init__(self, at: ResidualContext) -> None:
        super().__init__(at)
        self.alpha = deepnorm_alpha(at.side, at.n_enc, at.n_dec)  # a constant of the architecture, not state

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return self.norm(self.alpha * x + self.dropout(branch(x)))


@residual_kind("admin")
class Admin(PostLN):
    """LN(omega * x + dropout(f(x))), omega trainable (Transformer-Clinic's ``*_ratio_change``).

    omega starts at 1 (plain Post-LN); ``tfx.init.admin`` sets it from a profiling pass, and
    from then on it is a weight like any other, saved and resumed with the state dict.
    """

    def __init__(self, at: ResidualContext) -> None:
        super().__init__(at)
        self.side = at.side  # profiling keeps one running variance per stack
        self.omega = nn.Parameter(torch.ones(at.d_model))

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return self.norm(self.omega * x + self.dropout(branch(x)))


class DynamicTanh(nn.Module):
    """DyT(x) = weight * tanh(alpha * x) + bias (Zhu, Chen, He, LeCun, Liu, CVPR 2025; jiachenzhu/DyT,
    ``dynamic_tanh.py``): alpha one learnable scalar, weight 1 and bias 0 per channel, as a LayerNorm's
    affine starts. tanh squashes the extreme activations a LayerNorm would scale down; alpha sets where."""

    def __init__(self, d_model: int, alpha_init: float) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), alpha_init))
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * torch.tanh(self.alpha * x) + self.bias


@residual_kind("dyt")
class DyT(Residual):
    """x + dropout(f(DyT(x))): Pre-LN with DyT where each LayerNorm was, the stack-final one too, as the
    reference's ``convert_ln_to_dyt`` turns a Pre-LN model into its DyT model."""

    config_fields = ("dyt_alpha",)

    def __init__(self, at: ResidualContext, *, dyt_alpha: float) -> None:
        super().__init__(at)
        self.norm = DynamicTanh(at.d_model, dyt_alpha)

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return x + self.dropout(branch(self.norm(x)))

    @classmethod
    def final_module(cls, at: ResidualContext, *, dyt_alpha: float) -> nn.Module:
        return DynamicTanh(at.d_model, dyt_alpha)


@residual_kind("rezero")
class ReZero(Residual):
    """x + resweight * dropout(f(x)), no LayerNorm (majumderb/rezero, ``rezero/transformer/rztx.py``).

    resweight starts at 0, so every layer is the identity map at init and the stack's output is its
    input. The reference keeps one resweight per layer (``RZTXEncoderLayer.resweight``) that all its
    sublayers multiply by: with ``rezero_shared`` (``model.rezero_shared``, the default),
    ``share_within_layer`` makes this layer's blocks hold that one Parameter; without, each sublayer keeps its own.
    """

    config_fields = ("rezero_shared",)

    def __init__(self, at: ResidualContext, *, rezero_shared: bool) -> None:
        super().__init__(at)
        self.shared = rezero_shared  # a setting of the architecture, not state
        self.resweight = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return x + self.resweight * self.dropout(branch(x))

    @classmethod
    def share_within_layer(cls, blocks: Sequence[Residual]) -> None:
        if not blocks[0].shared:
            return
        shared = blocks[0].resweight
        for block in blocks[1:]:
            block.resweight = shared  # the same Parameter: one scalar, one gradient, one optimizer state


@residual_kind("fixup")
class Fixup(Residual):
    """x + scale * dropout(f(x - shift)), no LayerNorm (hongyi-zhang/Fixup, ``fairseq/fairseq/models/
    transformer_zero.py``): Fixup's scalar bias before each branch and scalar multiplier after it
    (``LayerShift`` 0, ``LayerScale`` 1). The zeroed and depth-scaled weights are ``tfx.init.fixup``."""

    def __init__(self, at: ResidualContext) -> None:
        super().__init__(at)
        self.shift = nn.Parameter(torch.zeros(1))
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: Tensor, branch: Branch) -> Tensor:
        return x + self.scale * self.dropout(branch(x - self.shift))

    @classmethod
    def final_module(cls, at: ResidualContext, **options: Any) -> nn.Module:
        """The reference ends the encoder with ``scale0(shift0(x))`` and the decoder with ``shift0(x)``
        alone (its decoder's ``scale0`` is commented out)."""
        return FixupOutput(with_scale=at.side == "encoder")


class FixupOutput(nn.Module):
    """(x - shift) * scale at the end of a Fixup stack; the scale is left out where the reference has none."""

    def __init__(self, with_scale: bool) -> None:
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(1))
        self.scale = nn.Parameter(torch.ones(1)) if with_scale else None

    def forward(self, x: Tensor) -> Tensor:
        x = x - self.shift
        return x if self.scale is None else x * self.scale


def residual_class(kind: str) -> type[Residual]:
    """The ``Residual`` subclass registered as ``model.norm=kind``."""
    return _registered(kind)  # type: ignore[return-value]  # @residual_kind is on Residual subclasses only


def kind_options(cls: type[Residual], cfg: ModelConfig) -> dict[str, Any]:
    """The settings ``cls`` is built with, read from ``cfg``: the fields it names in ``config_fields`` (DyT's
    ``dyt_alpha``) and ``cfg.norm_options``, which ``ModelConfig`` checked against ``cfg.norm``'s ``Options``
    (so they are ``cls``'s when ``cls`` is that kind). The other kinds' settings are not its business."""
    if missing := [name for name in cls.config_fields if not hasattr(cfg, name)]:
        raise TypeError(f"residual kind {cls.__name__} reads {missing}, which ModelConfig does not have")
    return {name: getattr(cfg, name) for name in cls.config_fields} | cfg.norm_options


def make_residual(cfg: ModelConfig, at: ResidualContext) -> Residual:
    """The residual connection of one sublayer at ``at`` in the model ``cfg`` describes (kind ``cfg.norm``)."""
    cls = residual_class(cfg.norm)
    return cls(at, **kind_options(cls, cfg))


def final_norm(cfg: ModelConfig, side: Side) -> nn.Module:
    """The module that ends the ``side`` stack: a LayerNorm (Pre-LN), a DyT, Fixup's scalar shift and scale,
    or the identity."""
    cls = residual_class(cfg.norm)
    depth = cfg.encoder_layers if side == "encoder" else cfg.decoder_layers
    return cls.final_module(ResidualContext.of(cfg, side, depth), **kind_options(cls, cfg))


def has_layer_norm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.LayerNorm) for m in model.modules())


__all__ = [
    "RESIDUALS",
    "Admin",
    "DeepNorm",
    "DyT",
    "DynamicTanh",
    "Fixup",
    "FixupOutput",
    "PostLN",
    "PreLN",
    "ReZero",
    "Residual",
    "ResidualContext",
    "deepnorm_alpha",
    "final_norm",
    "has_layer_norm",
    "make_residual",
    "residual_class",
    "kind_options",
    "residual_kind",
]

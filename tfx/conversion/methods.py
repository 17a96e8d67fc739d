"""What ``convert(model, method=NAME)`` does to the norms and weights: one ``Method`` record per name.

A method is a norm replacement (what stands where each LayerNorm was) and whether T-Fixup's depth factors follow
the Xavier base. ``tfixup`` removes every norm and scales; ``dyt`` puts DyT (Zhu et al. 2025) and ``derf`` Derf
(Chen et al. 2025) where each norm was, on the Xavier base, as tfx's ``method=dyt``/``method=derf`` initialise, with
the modules and initial alpha (and shift) of tfx's own kinds. Another replacement is one
``register_method(Method(...))`` in a module of its own.

Fixup and ReZero are refused, not approximated: both put a learnable scalar *inside* each residual branch
(x + a * f(x), Fixup also x - b before f), and ``nn.TransformerEncoderLayer.forward`` adds its residual itself,
with no place for it. Doing it from outside needs forward hooks on the attention and FFN submodules, which also
switch torch's fused fast path off or on depending on where they sit; that is not a conversion one can check
by reading the model, so tfx trains those two only in its own model (``method=fixup``, ``method=rezero``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from tfx.model.kinds.derf import DerfOptions, DynamicErf
from tfx.model.residual import DynamicTanh

NormReplacement = Callable[[nn.Module], nn.Module]  # the norm being replaced -> what stands in its place

# tfx's model.dyt_alpha default: the DyT reference's alpha for non-LLM models
DYT_ALPHA = 0.5


@dataclass(frozen=True)
class Method:
    """``replace_norm`` builds the module that takes each norm's place; ``depth_scaled``: T-Fixup's factors
    (v/out/FFN weights and embeddings by stack depth) follow the Xavier base, else the base stays as it is."""

    name: str
    replace_norm: NormReplacement
    depth_scaled: bool
    summary: str


METHODS: dict[str, Method] = {}

REFUSED = {
    name: (
        f"method={name!r} needs a learnable scalar inside every residual branch, which nn.Transformer*Layer.forward "
        f"has no place for (only forward hooks could add it, and they change torch's fast path); use tfx's own model "
        f"with method={name}, or method='tfixup' here (docs/convert.md)"
    )
    for name in ("fixup", "rezero")
}


def register_method(method: Method) -> Method:
    """Make ``convert(model, method=method.name)`` use ``method``; a name is registered once."""
    if method.name in METHODS and METHODS[method.name] != method:
        raise ValueError(f"conversion method {method.name!r} is registered twice")
    if method.name in REFUSED:
        raise ValueError(f"conversion method {method.name!r} is refused by design: {REFUSED[method.name]}")
    METHODS[method.name] = method
    return method


def method_named(name: str) -> Method:
    if name in REFUSED:
        raise ValueError(REFUSED[name])
    if name not in METHODS:
        raise ValueError(f"method={name!r}: use one of {sorted(METHODS)}")
    return METHODS[name]


class RemovedNorm(nn.Identity):
    """The identity where a norm was; its repr keeps what it replaced, so a printed model shows the conversion."""

    def __init__(self, was: str) -> None:
        super().__init__()
        self.was = was

    def extra_repr(self) -> str:
        return f"removed {self.was}"


def norm_width(norm: nn.Module) -> int:
    """The channels a LayerNorm/RMSNorm normalises over (one trailing dimension: what a transformer's norms have)."""
    shape = tuple(norm.normalized_shape)
    if len(shape) != 1:
        raise ValueError(f"{norm!r}: normalises over {shape}; only one trailing dimension can be replaced")
    return shape[0]


def remove_norm(norm: nn.Module) -> nn.Module:
    return RemovedNorm(repr(norm))


def dyt_norm(norm: nn.Module) -> nn.Module:
    return DynamicTanh(norm_width(norm), DYT_ALPHA)


def derf_norm(norm: nn.Module) -> nn.Module:
    """Derf at tfx's ``model.norm_options`` defaults (the reference ViT's alpha 0.5, shift 0)."""
    options = DerfOptions()
    return DynamicErf(norm_width(norm), options.alpha, options.shift)


TFIXUP = register_method(
    Method("tfixup", remove_norm, True, "no norms; Xavier, embeddings N(0, d^-1/2), T-Fixup's depth factors")
)
DYT = register_method(
    Method("dyt", dyt_norm, False, f"DyT(alpha={DYT_ALPHA}) where each norm was; Xavier, embeddings N(0, d^-1/2)")
)
DERF = register_method(
    Method("derf", derf_norm, False, "Derf(alpha=0.5, shift=0) where each norm was; Xavier, embeddings N(0, d^-1/2)")
)

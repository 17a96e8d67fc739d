"""Initialization schemes, one file each, chosen by name (``init.name``).

Order is always: build the model -> ``apply_init`` -> build the optimizer. A scheme is
``init(model, seed, batch)``: ``batch`` is the first training batch, which a data-dependent
scheme (Admin's profiling pass) needs and the others ignore.
"""

from __future__ import annotations

from collections.abc import Callable

from tfx.init.admin import init_admin
from tfx.init.component_wise import init_component_wise
from tfx.init.deepnorm import deepnorm_beta, init_deepnorm
from tfx.init.fixup import fixup_attention_scale, fixup_branches, fixup_ffn_scale, init_fixup
from tfx.init.tfixup import init_tfixup, tfixup_decoder_scale, tfixup_embedding_scale, tfixup_encoder_scale
from tfx.init.xavier import ModelInputs, init_xavier
from tfx.model import Transformer

InitFn = Callable[[Transformer, int, ModelInputs | None], None]

# The one registry of init schemes: tfx.config validates ``init.name`` against its keys.
SCHEMES: dict[str, InitFn] = {
    "xavier": init_xavier,
    "tfixup": init_tfixup,
    "component_wise": init_component_wise,
    "deepnorm": init_deepnorm,
    "admin": init_admin,
    "fixup": init_fixup,
}

# Schemes that read the first training batch (the trainer plans it only for these).
NEEDS_BATCH: frozenset[str] = frozenset({"admin"})

# Schemes that only make sense with one residual kind (``model.norm``).
NEEDS_NORM: dict[str, str] = {"tfixup": "none", "deepnorm": "deepnorm", "admin": "admin", "fixup": "fixup"}


def check_fits(name: str, norm: str) -> None:
    """Refuse an init scheme on a residual kind it was not made for (one line, both names)."""
    needed = NEEDS_NORM.get(name)
    if needed is not None and norm != needed:
        raise ValueError(
            f"init.name={name} needs model.norm={needed} (got {norm!r}); "
            f"method={name} sets both (conf/method/), init=xavier fits every model.norm"
        )


def apply_init(model: Transformer, name: str, seed: int = 1, batch: ModelInputs | None = None) -> None:
    """Initialize ``model`` in place with the named scheme; deterministic for a seed (and batch)."""
    if name not in SCHEMES:
        raise ValueError(f"init.name={name!r}: use one of {sorted(SCHEMES)}")
    check_fits(name, model.norm)
    SCHEMES[name](model, seed, batch)


__all__ = [
    "NEEDS_BATCH",
    "NEEDS_NORM",
    "ModelInputs",
    "SCHEMES",
    "apply_init",
    "check_fits",
    "deepnorm_beta",
    "fixup_attention_scale",
    "fixup_branches",
    "fixup_ffn_scale",
    "init_admin",
    "init_component_wise",
    "init_deepnorm",
    "init_fixup",
    "init_tfixup",
    "init_xavier",
    "tfixup_decoder_scale",
    "tfixup_embedding_scale",
    "tfixup_encoder_scale",
]

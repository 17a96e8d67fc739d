"""Initialization schemes, one file each, chosen by name (``init.name``).

Order is always: build the model -> ``apply_init`` -> build the optimizer. A scheme is
``init(model, seed, batch)``: ``batch`` is the first training batch, which a data-dependent
scheme (Admin's profiling pass) needs and the others ignore. Each file registers its own
``Scheme`` record (``tfx.init.scheme``); importing this package imports every file in it.
"""

from __future__ import annotations

import importlib
import pkgutil

from tfx.init.admin import init_admin
from tfx.init.component_wise import init_component_wise
from tfx.init.deepnorm import deepnorm_beta, init_deepnorm
from tfx.init.fixup import fixup_attention_scale, fixup_branches, fixup_ffn_scale, init_fixup
from tfx.init.scheme import SCHEMES, Scheme, register
from tfx.init.tfixup import init_tfixup, tfixup_decoder_scale, tfixup_embedding_scale, tfixup_encoder_scale
from tfx.init.tfixup_ln import init_tfixup_ln
from tfx.init.xavier import ModelInputs, init_xavier
from tfx.model import Transformer


def _import_scheme_files() -> None:
    """Import every module of this package, so that each scheme file's ``register`` runs: a new file is a new
    scheme, with no list here to keep in step."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


_import_scheme_files()


def check_fits(name: str, norm: str) -> None:
    """Refuse an init scheme on a residual kind it was not made for (one line, both names)."""
    if name in SCHEMES and not SCHEMES[name].fits(norm):
        raise ValueError(
            f"init.name={name} needs model.norm={' or '.join(SCHEMES[name].norms())} (got {norm!r}); "
            "a method (conf/method/) sets both, init=xavier fits every model.norm"
        )


def apply_init(model: Transformer, name: str, seed: int = 1, batch: ModelInputs | None = None) -> None:
    """Initialize ``model`` in place with the named scheme; deterministic for a seed (and batch)."""
    if name not in SCHEMES:
        raise ValueError(f"init.name={name!r}: use one of {sorted(SCHEMES)}")
    check_fits(name, model.norm)
    SCHEMES[name].init(model, seed, batch)


__all__ = [
    "SCHEMES",
    "ModelInputs",
    "Scheme",
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
    "init_tfixup_ln",
    "init_xavier",
    "register",
    "tfixup_decoder_scale",
    "tfixup_embedding_scale",
    "tfixup_encoder_scale",
]

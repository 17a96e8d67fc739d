"""Initialization schemes, one file each, chosen by name (``init.name``).

Order is always: build the model -> ``apply_init`` -> build the optimizer.
"""

from __future__ import annotations

from collections.abc import Callable

from tfx.init.component_wise import init_component_wise
from tfx.init.tfixup import init_tfixup, tfixup_decoder_scale, tfixup_embedding_scale, tfixup_encoder_scale
from tfx.init.xavier import init_xavier
from tfx.model import Transformer

InitFn = Callable[[Transformer, int], None]

SCHEMES: dict[str, InitFn] = {
    "xavier": init_xavier,
    "tfixup": init_tfixup,
    "component_wise": init_component_wise,
}


def apply_init(model: Transformer, name: str, seed: int = 1) -> None:
    """Initialize ``model`` in place with the named scheme; deterministic for a seed."""
    if name not in SCHEMES:
        raise ValueError(f"init.name={name!r}: use one of {sorted(SCHEMES)}")
    SCHEMES[name](model, seed)


__all__ = [
    "SCHEMES",
    "apply_init",
    "init_component_wise",
    "init_tfixup",
    "init_xavier",
    "tfixup_decoder_scale",
    "tfixup_embedding_scale",
    "tfixup_encoder_scale",
]

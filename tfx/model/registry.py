"""The registry of residual kinds: what ``model.norm`` may name.

A leaf of its own so that ``ModelConfig`` (``tfx.model.config``) can check ``model.norm`` against it while the
kinds (``tfx.model.residual``) read their options from ``ModelConfig``: neither imports the other's importer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import nn

K = TypeVar("K", bound=type[nn.Module])

# The one registry of residual kinds (``Residual`` subclasses), filled by ``residual_kind``.
RESIDUALS: dict[str, type[nn.Module]] = {}


def residual_kind(name: str) -> Callable[[K], K]:
    """Register the decorated class as ``model.norm=name``: a residual kind is this one line on its class."""

    def register(cls: K) -> K:
        taken = RESIDUALS.get(name)
        if taken is not None and (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"residual kind {name!r} is registered twice ({taken.__module__}.{taken.__qualname__})")
        RESIDUALS[name] = cls
        return cls

    return register


def residual_class(kind: str) -> type[nn.Module]:
    """The class registered as ``model.norm=kind``."""
    if kind not in RESIDUALS:
        raise ValueError(f"model.norm={kind!r}: use one of {sorted(RESIDUALS)}")
    return RESIDUALS[kind]

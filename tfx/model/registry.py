"""The registry of residual kinds: what ``model.norm`` may name, and the options each kind declares.

A leaf of its own so that ``ModelConfig`` (``tfx.model.config``) can check ``model.norm`` and
``model.norm_options`` against it while the kinds (``tfx.model.residual``, ``tfx.model.kinds``) read their options
from ``ModelConfig``: neither imports the other's importer.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

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


def resolve_options(kind: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """``model.norm_options`` for ``model.norm=kind``: every option the kind declares (the fields of its ``Options``
    dataclass), at ``given``'s value or else the declared default. The result is what a checkpoint records, so a
    default changed later cannot change a saved model. A name the kind does not declare or a value of the wrong
    type is refused in one line naming ``model.norm_options.NAME``; ``Options.__post_init__`` names its own."""
    declared = getattr(residual_class(kind), "Options", None)
    hints = typing.get_type_hints(declared) if declared is not None else {}
    names = [f.name for f in dataclasses.fields(declared)] if declared is not None else []
    if unknown := sorted(set(given) - set(names)):
        raise ValueError(
            f"model.norm_options.{unknown[0]}: model.norm={kind} has no such option (its options: "
            f"{', '.join(names) or 'none'})"
        )
    if declared is None:
        return {}
    typed = {name: _typed(name, value, hints[name]) for name, value in given.items()}
    return dataclasses.asdict(declared(**typed))


def _typed(name: str, value: Any, hint: Any) -> Any:
    """``value`` as the declared type ``hint``: an int where a float is declared becomes one (Hydra reads
    ``alpha=1`` as an int, and a Parameter must not become an integer tensor); anything else must match."""
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, hint) and (hint is bool or not isinstance(value, bool)):
        return value
    raise ValueError(f"model.norm_options.{name}={value!r} must be a {getattr(hint, '__name__', hint)}")

"""The registry of init schemes: one ``Scheme`` record per scheme, declared in the scheme's own file.

A scheme file ends with ``register(Scheme(...))``: its name (``init.name``), its function, and what it needs
(a residual kind, the first batch). ``tfx.init`` imports every file of the package, so a file there is
registered; a scheme outside tfx registers the same way from a module named in the config's ``plugins``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# init(model, seed, batch): batch is the first training batch, which only a needs_batch scheme reads
InitFn = Callable[..., None]


@dataclass(frozen=True)
class Scheme:
    """One init scheme and what it needs of the run."""

    name: str  # init.name, and conf/init/<name>.yaml
    init: InitFn  # (model, seed, batch) -> None, in place
    needs_norm: str | None = None  # the one residual kind (model.norm) it was made for; None: any
    needs_batch: bool = False  # reads the first training batch (Admin's profiling pass): the trainer plans it


# name -> Scheme, in registration order: tfx.config validates init.name against its keys
SCHEMES: dict[str, Scheme] = {}


def register(scheme: Scheme) -> Scheme:
    """Add ``scheme`` to ``SCHEMES``; a second scheme under a taken name is refused (re-importing one is not)."""
    taken = SCHEMES.get(scheme.name)
    if taken is not None and _where(taken.init) != _where(scheme.init):
        raise ValueError(f"init scheme {scheme.name!r} is registered twice ({taken.init.__module__})")
    SCHEMES[scheme.name] = scheme
    return scheme


def _where(fn: InitFn) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"

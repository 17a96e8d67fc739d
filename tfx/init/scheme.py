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
    # the residual kind (model.norm) it was made for, or the kinds (T-Fixup with LayerNorm kept: post, pre); None: any
    needs_norm: str | tuple[str, ...] | None = None
    needs_batch: bool = False  # reads the first training batch (Admin's profiling pass): the trainer plans it

    def fits(self, norm: str) -> bool:
        """Whether the scheme may initialize a model of residual kind ``norm``."""
        return self.needs_norm is None or norm in self.norms()

    def norms(self) -> tuple[str, ...]:
        """The residual kinds it names (none: it fits every kind)."""
        if self.needs_norm is None:
            return ()
        return (self.needs_norm,) if isinstance(self.needs_norm, str) else self.needs_norm


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

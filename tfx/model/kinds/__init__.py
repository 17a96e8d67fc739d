"""Residual kinds added after the comparison's first eight (those are ``tfx.model.residual``), one file each.

A file here is a whole kind: its ``Residual`` subclass with ``@residual_kind(NAME)`` on it and, if the kind has
settings of its own, its ``Options`` dataclass. Importing this package imports every file in it (``tfx.model``
does, so a kind is registered before any ``model.norm`` is checked): a new file is a new kind, with no list to
keep in step, as ``tfx/init/``'s scheme files are.
"""

from __future__ import annotations

import importlib
import pkgutil


def _import_kind_files() -> None:
    """Import every module of this package, so that each kind file's ``@residual_kind`` runs."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


_import_kind_files()

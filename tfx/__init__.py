"""tfx: encoder-decoder Transformers without LayerNorm or warmup, trained with T-Fixup initialization."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``from tfx import convert`` (``tfx.conversion.convert``) imports torch and tfx.init only when asked, so that
    ``import tfx`` stays cheap for the command lines."""
    if name == "convert":
        from tfx.conversion import convert

        return convert
    raise AttributeError(f"module 'tfx' has no attribute {name!r}")

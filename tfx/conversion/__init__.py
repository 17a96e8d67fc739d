"""T-Fixup for users' own PyTorch models: ``convert(model, method="tfixup")`` (``from tfx import convert``).

Takes a model built from ``nn.Transformer``, ``nn.TransformerEncoder(Layer)`` or ``nn.TransformerDecoder(Layer)``
(any ``batch_first``/``norm_first``), or from layers described by ``Block``; removes (or replaces) its norms and
sets tfx's T-Fixup init on it, keeping every module and parameter name. Sits above ``tfx.init`` (whose factor
functions it uses) and ``tfx.model`` (DyT); nothing in tfx imports it. docs/convert.md has the rules.
"""

from __future__ import annotations

from tfx.conversion.api import convert
from tfx.conversion.methods import METHODS, Method, RemovedNorm, register_method
from tfx.conversion.report import ConversionReport, NormChange, ParameterChange, StackSummary
from tfx.conversion.structure import Block, ConversionError

__all__ = [
    "METHODS",
    "Block",
    "ConversionError",
    "ConversionReport",
    "Method",
    "NormChange",
    "ParameterChange",
    "RemovedNorm",
    "StackSummary",
    "convert",
    "register_method",
]

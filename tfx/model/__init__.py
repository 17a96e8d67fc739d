"""The LayerNorm-optional encoder-decoder Transformer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfx.model import kinds  # noqa: F401  (registers tfx/model/kinds/: before any model.norm is checked)
from tfx.model.attention import MultiheadAttention
from tfx.model.config import ModelConfig
from tfx.model.layers import DecoderLayer, EncoderLayer, FeedForward
from tfx.model.residual import RESIDUALS, ResidualContext, has_layer_norm
from tfx.model.transformer import DecoderState, EncoderOut, Transformer


def build_model(cfg: ModelConfig | Mapping[str, Any], vocab_size: int, pad_id: int) -> Transformer:
    """The model ``cfg`` describes: a ``ModelConfig``, or a checkpoint's plain dict of its fields (fields the dict
    predates take their defaults: ``ModelConfig.from_fields``)."""
    return Transformer(ModelConfig.from_fields(cfg), vocab_size, pad_id)


__all__ = [
    "DecoderLayer",
    "DecoderState",
    "EncoderLayer",
    "EncoderOut",
    "FeedForward",
    "ModelConfig",
    "MultiheadAttention",
    "RESIDUALS",
    "ResidualContext",
    "Transformer",
    "build_model",
    "has_layer_norm",
]

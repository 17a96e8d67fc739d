"""The LayerNorm-optional encoder-decoder Transformer."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from tfx.model.attention import MultiheadAttention
from tfx.model.layers import DecoderLayer, EncoderLayer, FeedForward
from tfx.model.residual import RESIDUALS, has_layer_norm
from tfx.model.transformer import DecoderState, EncoderOut, Transformer


def build_model(model_cfg: Any, vocab_size: int, pad_id: int) -> Transformer:
    """Plain constructor arguments from a ``ModelConfig`` dataclass (or a dict of its fields)."""
    fields = model_cfg if isinstance(model_cfg, dict) else asdict(model_cfg)
    return Transformer(vocab_size=vocab_size, pad_id=pad_id, **fields)


__all__ = [
    "DecoderLayer",
    "DecoderState",
    "EncoderLayer",
    "EncoderOut",
    "FeedForward",
    "MultiheadAttention",
    "RESIDUALS",
    "Transformer",
    "build_model",
    "has_layer_norm",
]

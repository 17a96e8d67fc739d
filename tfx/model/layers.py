"""Encoder and decoder layers: attention and FFN sublayers, each inside its residual connection.

The residual kind (``tfx.model.residual``) comes in as a factory, so a layer reads the same for
every method: ``x = self.self_attn_block(x, lambda h: self.self_attn(h, h, ...))``. A kind whose
sublayers share state within the layer (ReZero's one resweight) ties it once the blocks exist.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from tfx.model.attention import KVCache, MultiheadAttention
from tfx.model.dropout import Dropout
from tfx.model.residual import Residual

ResidualFactory = Callable[[], Residual]  # a fresh residual connection for this layer's stack


class FeedForward(nn.Module):
    """fc2(dropout(relu(fc1(x)))): the position-wise ReLU FFN."""

    def __init__(self, d_model: int, ffn_dim: int, activation_dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)
        self.activation_dropout = Dropout(activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.activation_dropout(F.relu(self.fc1(x))))


class EncoderLayer(nn.Module):
    def __init__(
        self,
        d_model: int,
        heads: int,
        ffn_dim: int,
        residual: ResidualFactory,
        attention_dropout: float,
        activation_dropout: float,
    ) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, heads, attention_dropout)
        self.ffn = FeedForward(d_model, ffn_dim, activation_dropout)
        self.self_attn_block = residual()
        self.ffn_block = residual()
        self.ffn_block.share_within_layer([self.self_attn_block, self.ffn_block])

    def forward(self, x: Tensor, padding_mask: Tensor | None, attn_mask: Tensor | None = None) -> Tensor:
        """``attn_mask`` (True = may attend; packed rows) replaces ``padding_mask`` (True at padding)."""
        x = self.self_attn_block(x, lambda h: self.self_attn(h, h, key_padding_mask=padding_mask, attn_mask=attn_mask))
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        d_model: int,
        heads: int,
        ffn_dim: int,
        residual: ResidualFactory,
        attention_dropout: float,
        activation_dropout: float,
    ) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, heads, attention_dropout)
        self.encoder_attn = MultiheadAttention(d_model, heads, attention_dropout)
        self.ffn = FeedForward(d_model, ffn_dim, activation_dropout)
        self.self_attn_block = residual()
        self.encoder_attn_block = residual()
        self.ffn_block = residual()
        self.ffn_block.share_within_layer([self.self_attn_block, self.encoder_attn_block, self.ffn_block])

    def forward(
        self,
        x: Tensor,
        encoder_out: Tensor,
        encoder_padding_mask: Tensor | None,
        cache: dict[str, KVCache] | None = None,
        self_mask: Tensor | None = None,
        cross_mask: Tensor | None = None,
    ) -> Tensor:
        """Full (teacher-forced) pass when ``cache`` is None, else one incremental step.

        Decoder inputs are right-padded, so the causal mask alone keeps every real query
        away from padding; an incremental step attends to all cached keys (no mask needed).
        Packed rows pass their segment masks instead (``self_mask`` causal within each sentence,
        ``cross_mask`` to its own source; ``tfx.model.packing``).
        """
        self_cache = cache["self"] if cache is not None else None
        cross_cache = cache["cross"] if cache is not None else None
        causal = cache is None
        x = self.self_attn_block(
            x, lambda h: self.self_attn(h, h, causal=causal, cache=self_cache, attn_mask=self_mask)
        )
        x = self.encoder_attn_block(
            x,
            lambda h: self.encoder_attn(
                h, encoder_out, key_padding_mask=encoder_padding_mask, cache=cross_cache, static_kv=True,
                attn_mask=cross_mask,
            ),
        )  # fmt: skip
        return self.ffn_block(x, self.ffn)

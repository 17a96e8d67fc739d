"""Multi-head attention with separate q/k/v/out projections and a key/value cache.

The projections are separate modules (not one packed ``in_proj``) because T-Fixup
scales ``v_proj`` and ``out_proj`` but leaves ``q_proj`` and ``k_proj`` alone.
The kernel is ``F.scaled_dot_product_attention`` (flash / memory-efficient on GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

KVCache = dict[str, Tensor]


class MultiheadAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} must be divisible by heads={heads}")
        self.heads = heads
        self.head_dim = d_model // heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def _keys_values(self, kv: Tensor, cache: KVCache | None, static_kv: bool) -> tuple[Tensor, Tensor]:
        """Project keys/values, reusing or extending the cache when decoding step by step.

        ``static_kv`` (encoder-decoder attention): the source never changes, so its keys and
        values are computed on the first step only. Self-attention appends the new step.
        """
        if cache is not None and static_kv and "k" in cache:
            return cache["k"], cache["v"]
        k = self._split_heads(self.k_proj(kv))
        v = self._split_heads(self.v_proj(kv))
        if cache is not None:
            if not static_kv and "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        return k, v

    def forward(
        self,
        query: Tensor,
        key_value: Tensor,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        static_kv: bool = False,
    ) -> Tensor:
        """query (B, T, D), key_value (B, S, D); key_padding_mask (B, S) True at padding."""
        b, t, d = query.shape
        q = self._split_heads(self.q_proj(query))  # (B, H, T, Dh)
        k, v = self._keys_values(key_value, cache, static_kv)  # (B, H, S, Dh)
        mask = None
        if key_padding_mask is not None:
            mask = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, S), True = may attend
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=causal
        )  # (B, H, T, Dh)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))

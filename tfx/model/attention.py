"""Multi-head attention with separate q/k/v/out projections and a key/value cache.

The projections are separate modules (not one packed ``in_proj``) because T-Fixup
scales ``v_proj`` and ``out_proj`` but leaves ``q_proj`` and ``k_proj`` alone.
The kernel is ``F.scaled_dot_product_attention`` (flash / memory-efficient on GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class KVCache:
    """One attention layer's keys and values while decoding step by step, (N, H, steps, Dh).

    Self-attention appends each step into buffers allocated once for ``capacity`` steps, so a
    step writes one column instead of copying the whole prefix (``torch.cat``); past
    ``capacity`` the buffers double. Encoder-decoder attention stores the source's keys and
    values once (``static``): they never change while decoding.
    """

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity
        self.k: Tensor | None = None  # (N, H, capacity, Dh); valid up to ``length``
        self.v: Tensor | None = None
        self.length = 0

    @property
    def empty(self) -> bool:
        return self.k is None

    def keys_values(self) -> tuple[Tensor, Tensor]:
        """The valid part: views (N, H, length, Dh) of the buffers."""
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def store(self, k: Tensor, v: Tensor) -> None:
        """Keep ``k``/``v`` as they are (static: the encoder's)."""
        self.k, self.v, self.length = k, v, k.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write new steps (N, H, t, Dh) after the valid part; returns all valid keys and values."""
        end = self.length + k.size(2)
        if self.k is None or end > self.k.size(2):
            self._resize(max(end, self.capacity, 2 * self.length), k)
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.keys_values()

    def _resize(self, steps: int, like: Tensor) -> None:
        n, h, _, dh = like.shape
        k, v = like.new_empty(n, h, steps, dh), like.new_empty(n, h, steps, dh)
        if self.k is not None:
            k[:, :, : self.length], v[:, :, : self.length] = self.keys_values()
        self.k, self.v = k, v

    def reorder(self, order: Tensor) -> None:
        """Row i becomes row ``order[i]`` (beam search); only the valid part is copied."""
        if self.k is None:
            return
        if self.k.size(2) == self.length:  # static, or a full buffer: one gather
            self.k, self.v = self.k.index_select(0, order), self.v.index_select(0, order)
            return
        old_k, old_v = self.keys_values()
        shape = (order.numel(), *self.k.shape[1:])
        self.k, self.v = self.k.new_empty(shape), self.v.new_empty(shape)
        for old, new in ((old_k, self.k), (old_v, self.v)):
            if old.requires_grad:  # out= is not differentiable: gather, then copy
                new[:, :, : self.length] = old.index_select(0, order)
            else:  # decoding (inference mode): gather straight into the new buffer
                torch.index_select(old, 0, order, out=new[:, :, : self.length])


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
        if cache is not None and static_kv and not cache.empty:
            return cache.k, cache.v
        k = self._split_heads(self.k_proj(kv))
        v = self._split_heads(self.v_proj(kv))
        if cache is None:
            return k, v
        if static_kv:
            cache.store(k, v)
            return k, v
        return cache.append(k, v)

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

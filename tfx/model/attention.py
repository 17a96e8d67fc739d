"""Multi-head attention with separate q/k/v/out projections and a key/value cache.

The projections are separate modules (not one packed ``in_proj``) because T-Fixup
scales ``v_proj`` and ``out_proj`` but leaves ``q_proj`` and ``k_proj`` alone, and
because fairseq's checkpoints name them so. They still run as one GEMM where they share
an input: self-attention projects q, k and v with their weights concatenated, and
encoder-decoder attention k and v. One GEMM, and under autocast one cast of the input
instead of three; the weights and their initialization are the separate modules'.
The kernel is ``F.scaled_dot_product_attention`` (flash / memory-efficient on GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class KVCache:
    """One attention layer's keys and values while decoding step by step.

    Self-attention appends each step into buffers (N, capacity, H, Dh) allocated once, so a step writes
    one slice instead of copying the whole prefix (``torch.cat``); past ``capacity`` they double. Each
    row's filled steps are one contiguous block, which makes a beam reorder one block gather per row
    and gives attention a cheaper key layout than (N, H, capacity, Dh). A reorder gathers into a spare
    pair of buffers and swaps the two: allocating a fresh buffer of tens of MB every step costs page
    faults that doubled the reorder's time. Encoder-decoder attention stores the source's keys and
    values (B', H, S, Dh) once (``static``): they never change while decoding.
    """

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity
        self.k: Tensor | None = None  # (N, steps, H, Dh), valid up to ``length``; static: (B', H, S, Dh)
        self.v: Tensor | None = None
        self.length = 0
        self.static = False
        self._spare: tuple[Tensor, Tensor] | None = None  # the buffers a reorder gathers into

    @property
    def empty(self) -> bool:
        return self.k is None

    @property
    def steps_allocated(self) -> int:
        """Steps the self-attention buffers hold before they must grow."""
        return 0 if self.k is None else self.k.size(1)

    def keys_values(self) -> tuple[Tensor, Tensor]:
        """The valid part as (N, H, length, Dh) (views of the buffers)."""
        if self.static:
            return self.k, self.v
        return self.k[:, : self.length].transpose(1, 2), self.v[:, : self.length].transpose(1, 2)

    def store(self, k: Tensor, v: Tensor) -> None:
        """Keep ``k``/``v`` (N, H, S, Dh) as they are (static: the encoder's)."""
        self.k, self.v, self.length, self.static = k, v, k.size(2), True

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write new steps (N, H, t, Dh) after the valid part; returns all valid keys and values."""
        end = self.length + k.size(2)
        if self.k is None or end > self.k.size(1):
            self._resize(max(end, self.capacity, 2 * self.length), k)
        self.k[:, self.length : end] = k.transpose(1, 2)
        self.v[:, self.length : end] = v.transpose(1, 2)
        self.length = end
        return self.keys_values()

    def _resize(self, steps: int, like: Tensor) -> None:
        n, h, _, dh = like.shape
        k, v = like.new_empty(n, steps, h, dh), like.new_empty(n, steps, h, dh)
        if self.k is not None:
            k[:, : self.length], v[:, : self.length] = self.k[:, : self.length], self.v[:, : self.length]
        self.k, self.v, self._spare = k, v, None

    def reorder(self, order: Tensor) -> None:
        """Row i becomes row ``order[i]`` (beam search; fewer rows when sentences finish, more when
        the beams of a sentence first fan out); only the valid part is copied."""
        if self.k is None:
            return
        if self.static:
            self.k, self.v = self.k.index_select(0, order), self.v.index_select(0, order)
            return
        if self.k.requires_grad:  # out= is not differentiable: gather into fresh buffers
            shape = (order.numel(), *self.k.shape[1:])
            k, v = self.k.new_zeros(shape), self.v.new_zeros(shape)
            k[:, : self.length] = self.k[:, : self.length].index_select(0, order)
            v[:, : self.length] = self.v[:, : self.length].index_select(0, order)
            self.k, self.v = k, v
            return
        n = order.numel()
        spare = self._spare
        if spare is None or spare[0].size(0) < n:
            spare = (self.k.new_empty(n, *self.k.shape[1:]), self.v.new_empty(n, *self.v.shape[1:]))
        new_k, new_v = spare[0][:n], spare[1][:n]  # contiguous rows: a prefix of a bigger buffer serves too
        torch.index_select(self.k[:, : self.length], 0, order, out=new_k[:, : self.length])
        torch.index_select(self.v[:, : self.length], 0, order, out=new_v[:, : self.length])
        self._spare = (self.k, self.v)
        self.k, self.v = new_k, new_v


def key_mask(key_padding_mask: Tensor) -> Tensor:
    """(B, 1, 1, S), True = may attend, from a (B, S) mask that is True at padding."""
    return ~key_padding_mask[:, None, None, :]


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

    def _project(self, x: Tensor, projections: tuple[nn.Linear, ...]) -> tuple[Tensor, ...]:
        """``x`` through several projections as one GEMM, split into heads: (N, H, T, Dh) each."""
        if len(projections) == 1:  # nothing to concatenate: copying the weight would be the only effect
            return (self._split_heads(projections[0](x)),)
        weight = torch.cat([p.weight for p in projections])
        bias = torch.cat([p.bias for p in projections])
        return tuple(self._split_heads(y) for y in F.linear(x, weight, bias).chunk(len(projections), dim=-1))

    def _queries_keys_values(
        self, query: Tensor, kv: Tensor, cache: KVCache | None, static_kv: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Project queries, keys and values, reusing or extending the cache when decoding step by step.

        Self-attention (``kv is query``) projects all three at once and appends the new step to
        its cache. ``static_kv`` (encoder-decoder attention): the source never changes, so its
        keys and values are projected (together) on the first step only.
        """
        if kv is query and not static_kv:
            q, k, v = self._project(query, (self.q_proj, self.k_proj, self.v_proj))
            return (q, k, v) if cache is None else (q, *cache.append(k, v))
        (q,) = self._project(query, (self.q_proj,))
        if cache is not None and static_kv and not cache.empty:
            return q, cache.k, cache.v
        k, v = self._project(kv, (self.k_proj, self.v_proj))
        if cache is None:
            return q, k, v
        if static_kv:
            cache.store(k, v)
            return q, k, v
        return q, *cache.append(k, v)

    def forward(
        self,
        query: Tensor,
        key_value: Tensor,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        static_kv: bool = False,
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        """query (N, T, D), key_value (B, S, D); key_padding_mask (B, S) True at padding.

        ``attn_mask`` (bool, True = may attend, broadcastable to (B, H, T, S)) replaces both
        ``key_padding_mask`` and ``causal``: a stack builds it once for all its layers (packed rows,
        ``tfx.model.packing``; padded batches, ``key_mask``).

        ``N`` may be a multiple ``g * B`` of the key rows: query rows ``i*g .. i*g+g-1`` then share key
        row ``i`` (the beams of one sentence share its source). They attend as one row with ``g * T``
        queries, so the source's keys and values are projected and read once per sentence, not per beam.
        """
        n, t, d = query.shape
        q, k, v = self._queries_keys_values(query, key_value, cache, static_kv)  # (N, H, T, Dh), (B, H, S, Dh) x 2
        b = k.size(0)
        groups = n // b if b else 1
        if groups * b != n or (groups > 1 and causal):
            raise ValueError(f"{n} query rows cannot share {b} key rows" + (" under a causal mask" if causal else ""))
        if groups > 1:
            q = q.view(b, groups, self.heads, t, self.head_dim).transpose(1, 2).reshape(b, self.heads, groups * t, -1)
        mask = attn_mask
        if mask is None and key_padding_mask is not None:
            mask = key_mask(key_padding_mask)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=causal and mask is None
        )  # (B, H, g*T, Dh)
        if groups > 1:
            out = out.view(b, self.heads, groups, t, self.head_dim).transpose(1, 2)  # (B, g, H, T, Dh)
        return self.out_proj(out.reshape(n, self.heads, t, self.head_dim).transpose(1, 2).reshape(n, t, d))

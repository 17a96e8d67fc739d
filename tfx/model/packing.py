"""Packed rows: several sentence pairs per row of fixed-size token buffers, so every batch has one shape.

The layout is t5x/seqio's packing (``encoder_segment_ids`` / ``decoder_segment_ids`` and per-token
positions): row ``r`` of the source buffer holds the sources of some pairs one after another, row
``r`` of the target buffer their targets, in the same order. Each token carries its sentence's
segment id (1, 2, ... within its row; 0 at padding) and its position inside the sentence, so
positions restart per sentence and attention never crosses a sentence boundary:

- encoder self-attention: a query sees the keys of its own segment;
- decoder self-attention: of its own segment, up to itself;
- encoder-decoder attention: its pair's source (the same segment id in the same row).

Padding queries see every key. Their outputs are ignored (the loss skips PAD targets, padding
keys are masked for every real query), but they must be finite: a query with no key at all makes
``scaled_dot_product_attention`` return NaN, and a NaN value reaches real queries as 0 * NaN.
The masks are dense booleans (R, 1, Tq, Tk), built once per forward: exact on every device; on
CUDA SDPA runs them with its memory-efficient kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Packing:
    """Where each token of a packed batch belongs; all (R, S) or (R, T) integer tensors."""

    src_segments: Tensor  # sentence id within the row, 1-based; 0 at padding
    tgt_segments: Tensor
    src_positions: Tensor  # position inside the sentence (0 at its first token; 0 at padding)
    tgt_positions: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Packing:
        return Packing(*(t.to(device, non_blocking=non_blocking) for t in self._tensors()))

    def pin_memory(self) -> Packing:
        return Packing(*(t.pin_memory() for t in self._tensors()))

    def _tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.src_segments, self.tgt_segments, self.src_positions, self.tgt_positions


def segment_mask(query_segments: Tensor, key_segments: Tensor, causal: bool = False) -> Tensor:
    """(R, 1, Tq, Tk), True where a query may attend: its own segment (causal: up to itself);
    padding queries (segment 0) everywhere."""
    allowed = (query_segments[:, :, None] == key_segments[:, None, :]) & (key_segments[:, None, :] != 0)
    if causal:
        tq, tk = query_segments.size(1), key_segments.size(1)
        allowed &= torch.ones(tq, tk, dtype=torch.bool, device=allowed.device).tril()
    allowed |= (query_segments == 0)[:, :, None]
    return allowed[:, None]

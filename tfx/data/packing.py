"""Packed batches: sentence pairs laid end to end in rows of fixed-size source and target buffers.

Every training batch of a run then has one shape, ``(rows, src_len)`` and ``(rows, tgt_len)``, so
``torch.compile`` specializes once and CUDA graphs can replay it; padded batches (``batching.py``)
have hundreds of shapes per epoch. The layout and the attention it implies are t5x/seqio's
(``tfx.model.packing``); the loss is normalized by real target tokens as with padding.

An epoch's plan depends only on (seed, epoch), like ``make_batches``: the shuffled examples are
cut into chunks, each chunk is packed first-fit in decreasing size (a pair goes into the first row
with room for both its source and its target), rows are grouped ``rows`` at a time, and the batch
order is shuffled. Every example lands in exactly one row of one rank's batch.
"""

from __future__ import annotations

import numpy as np
import torch

from tfx.data.batching import Batch
from tfx.data.corpus import EncodedSplit
from tfx.data.errors import DataError
from tfx.data.vocab import BOS, PAD
from tfx.model.packing import Packing

CHUNK_BATCHES = 64  # batches' worth of pairs packed together: more fill rows better, fewer mix lengths less
ROUND_TO = 8  # row lengths round up to a multiple of this (tensor-core friendly)

PackedPlan = list[list[list[int]]]  # batches -> rows -> example indices


def row_lengths(split: EncodedSplit, pack_length: int = 0) -> tuple[int, int]:
    """(source, target) row length: ``pack_length``, or the split's longest sentence rounded up."""
    longest_src, longest_tgt = int(split.src_sizes.max(initial=1)), int(split.tgt_sizes.max(initial=1))
    if pack_length:
        if max(longest_src, longest_tgt) > pack_length:
            raise DataError(
                f"data.pack_length={pack_length} is shorter than the longest training sentence "
                f"({max(longest_src, longest_tgt)} tokens): raise it, or lower data.max_*_positions to filter"
            )
        return pack_length, pack_length
    return _round_up(longest_src), _round_up(longest_tgt)


def _round_up(n: int) -> int:
    return -(-n // ROUND_TO) * ROUND_TO


def rows_per_batch(max_tokens: int, src_len: int, tgt_len: int) -> int:
    """As many rows as ``max_tokens`` holds at the longer row length (at least one)."""
    return max(1, max_tokens // max(src_len, tgt_len))


def make_packed_batches(
    split: EncodedSplit,
    rows: int,
    src_len: int,
    tgt_len: int,
    seed: int = 1,
    epoch: int = 1,
    rank: int = 0,
    world_size: int = 1,
) -> PackedPlan:
    """This rank's packed batches for one epoch: each a list of at most ``rows`` rows of example indices.

    Every rank gets the same number of batches (the last ones may be empty: all padding, no loss).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(split))
    mean_src = float(split.src_sizes.mean()) if len(split) else 1.0
    per_row = max(1, int(src_len / max(mean_src, 1.0)))  # pairs a row holds, roughly
    chunk = CHUNK_BATCHES * rows * per_row
    packed_rows: list[list[int]] = []
    for start in range(0, len(order), chunk):
        packed_rows += pack_first_fit(order[start : start + chunk], split, src_len, tgt_len)
    batches = [packed_rows[i : i + rows] for i in range(0, len(packed_rows), rows)]
    batches = [batches[i] for i in rng.permutation(len(batches))]
    batches += [[] for _ in range(-len(batches) % world_size)]
    return batches[rank::world_size]


def pack_first_fit(indices: np.ndarray, split: EncodedSplit, src_len: int, tgt_len: int) -> list[list[int]]:
    """Rows of ``indices``: longest pair first, each into the first row with room for both sides."""
    src, tgt = split.src_sizes[indices], split.tgt_sizes[indices]
    if len(indices) and (src.max() > src_len or tgt.max() > tgt_len):
        raise DataError(f"a pair of {src.max()}/{tgt.max()} tokens does not fit rows of {src_len}/{tgt_len}")
    by_size = np.lexsort((src, np.maximum(src, tgt)))[::-1]
    src_free = np.empty(len(indices), dtype=np.int64)  # at most one row per pair
    tgt_free = np.empty(len(indices), dtype=np.int64)
    rows: list[list[int]] = []
    for k in by_size.tolist():
        n = len(rows)
        fits = np.flatnonzero((src_free[:n] >= src[k]) & (tgt_free[:n] >= tgt[k]))
        if len(fits):
            row = int(fits[0])
        else:
            row, src_free[n], tgt_free[n] = n, src_len, tgt_len
            rows.append([])
        rows[row].append(int(indices[k]))
        src_free[row] -= src[k]
        tgt_free[row] -= tgt[k]
    return rows


def collate_packed(split: EncodedSplit, rows: list[list[int]], n_rows: int, src_len: int, tgt_len: int) -> Batch:
    """A ``Batch`` of shape (n_rows, src_len) / (n_rows, tgt_len) with its ``Packing``.

    Each pair's decoder input is [BOS] + its target without EOS, inside its own segment, exactly as
    ``collate`` builds it for a padded row; rows past ``len(rows)`` are all padding.
    """
    shape_src, shape_tgt = (n_rows, src_len), (n_rows, tgt_len)
    src_tokens, target, prev = np.full(shape_src, PAD), np.full(shape_tgt, PAD), np.full(shape_tgt, PAD)
    src_seg, tgt_seg = np.zeros(shape_src, np.int64), np.zeros(shape_tgt, np.int64)
    src_pos, tgt_pos = np.zeros(shape_src, np.int64), np.zeros(shape_tgt, np.int64)
    indices: list[int] = []
    for r, row in enumerate(rows):
        s_at = t_at = 0
        for segment, i in enumerate(row, start=1):
            s, t = split.src[i], split.tgt[i]
            src_tokens[r, s_at : s_at + len(s)] = s
            src_seg[r, s_at : s_at + len(s)] = segment
            src_pos[r, s_at : s_at + len(s)] = np.arange(len(s))
            target[r, t_at : t_at + len(t)] = t
            prev[r, t_at] = BOS
            prev[r, t_at + 1 : t_at + len(t)] = t[:-1]
            tgt_seg[r, t_at : t_at + len(t)] = segment
            tgt_pos[r, t_at : t_at + len(t)] = np.arange(len(t))
            s_at, t_at = s_at + len(s), t_at + len(t)
            indices.append(int(i))
    as_tensor = torch.from_numpy
    return Batch(
        src_tokens=as_tensor(src_tokens),
        src_lengths=as_tensor((src_seg > 0).sum(1)),  # real source tokens per row
        prev_output_tokens=as_tensor(prev),
        target=as_tensor(target),
        ntokens=int((tgt_seg > 0).sum()),
        indices=indices,
        packing=Packing(*(as_tensor(a) for a in (src_seg, tgt_seg, src_pos, tgt_pos))),
    )

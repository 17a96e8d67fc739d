"""Token-budget batching with length bucketing, data-parallel sharding, and padding (``collate``).

Batches hold sentences of similar length so padding is small; their order is shuffled per
(seed, epoch) so every rank computes the same plan without communicating.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from tfx.data.corpus import EncodedSplit
from tfx.data.errors import DataError
from tfx.data.vocab import BOS, PAD
from tfx.model.packing import Packing


@dataclass
class Batch:
    """One padded batch; row ``r`` is example ``indices[r]`` of its split."""

    src_tokens: Tensor  # (B, S) int64, right-padded with PAD, each row ends with EOS
    src_lengths: Tensor  # (B,) int64, non-pad source tokens
    prev_output_tokens: Tensor  # (B, T) int64, [BOS] + target[:-1]: teacher-forced decoder input
    target: Tensor  # (B, T) int64, ends with EOS, right-padded with PAD
    ntokens: int  # non-pad target tokens (the loss normalizer)
    indices: list[int]  # positions in the split, to write translations back in input order
    packing: Packing | None = None  # several sentences per row (``tfx.data.packing``); None: one per row

    def _map(self, fn) -> Batch:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return Batch(**{k: fn(v) if isinstance(v, Tensor | Packing) else v for k, v in values.items()})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy with every tensor on ``device``."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """A copy in page-locked memory, so ``to("cuda", non_blocking=True)`` overlaps compute."""
        return self._map(lambda t: t.pin_memory())

    def __len__(self) -> int:
        return len(self.indices)


def collate(split: EncodedSplit, indices: list[int]) -> Batch:
    """Pad the examples at ``indices`` into a ``Batch`` (padding is built here, once per batch)."""
    src = [split.src[i] for i in indices]
    tgt = [split.tgt[i] for i in indices]
    src_lengths = split.src_sizes[indices]
    tgt_lengths = split.tgt_sizes[indices]
    src_tokens = np.full((len(indices), src_lengths.max()), PAD, dtype=np.int64)
    target = np.full((len(indices), tgt_lengths.max()), PAD, dtype=np.int64)
    for row, (s, t) in enumerate(zip(src, tgt, strict=True)):
        src_tokens[row, : len(s)] = s
        target[row, : len(t)] = t
    # Shift right: the decoder sees BOS then the target without its last token (EOS).
    prev = np.empty_like(target)
    prev[:, 0] = BOS
    prev[:, 1:] = target[:, :-1]
    prev[target == PAD] = PAD  # the shifted EOS lands on padding
    return Batch(
        src_tokens=torch.from_numpy(src_tokens),
        src_lengths=torch.from_numpy(src_lengths.astype(np.int64)),
        prev_output_tokens=torch.from_numpy(prev),
        target=torch.from_numpy(target),
        ntokens=int(tgt_lengths.sum()),
        indices=[int(i) for i in indices],
    )


def make_batches(
    split: EncodedSplit,
    max_tokens: int,
    max_sentences: int | None = None,
    shuffle: bool = True,
    seed: int = 1,
    epoch: int = 1,
    rank: int = 0,
    world_size: int = 1,
) -> list[np.ndarray]:
    """This rank's batches (arrays of example indices) for one epoch.

    A batch costs ``n_sentences * max(len)`` over source and target (fairseq's padded count) and
    stays within ``max_tokens``, except a single example longer than the budget, which gets a batch
    of its own rather than being dropped (valid/test must keep every sentence). With
    ``shuffle=False`` the plan is fixed (valid/test); otherwise it depends only on (seed, epoch).
    Every rank gets the same number of batches and each example lands on exactly one rank.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    rng = np.random.default_rng([seed, epoch]) if shuffle else None
    sizes = np.maximum(split.src_sizes, split.tgt_sizes)
    order = length_order(split, sizes, rng)
    batches = group_by_budget(order, sizes, max_tokens, max_sentences)
    batches = even_out(batches, world_size)
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches[rank::world_size]


def length_order(split: EncodedSplit, sizes: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """Indices sorted by padded size, then source length; ties in random order when shuffling."""
    ties = rng.permutation(len(sizes)) if rng is not None else np.arange(len(sizes))
    return np.lexsort((ties, split.src_sizes, sizes))  # last key is the primary one


def group_by_budget(
    order: np.ndarray, sizes: np.ndarray, max_tokens: int, max_sentences: int | None
) -> list[list[int]] | list[np.ndarray]:
    """Cut the length-sorted ``order`` into consecutive runs within the token budget.

    Sorted by size (as ``length_order`` sorts), a run's padded cost ``count x size of its last`` only grows as
    it extends, so each run's end is one ``searchsorted`` over a window: a batch at a time, not a sentence at a
    time (a 4.5M-pair epoch plans in about a second). Other orders take the sentence-by-sentence loop.
    """
    cap = max_sentences or len(order)
    ordered = sizes[order]
    if len(order) and (np.diff(ordered) < 0).any():
        return _group_in_order(order, ordered, max_tokens, cap)
    starts, start = [], 0
    while start < len(order):
        width = min(cap, len(order) - start, max_tokens // max(int(ordered[start]), 1) + 1)
        cost = ordered[start : start + width] * np.arange(1, width + 1)
        starts.append(start)
        start += max(int(np.searchsorted(cost, max_tokens, side="right")), 1)  # an over-long one: a batch alone
    return np.split(order, starts[1:]) if starts else []


def _group_in_order(order: np.ndarray, ordered: np.ndarray, max_tokens: int, cap: int) -> list[list[int]]:
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, size in zip(order.tolist(), ordered.tolist(), strict=True):
        longest_with = max(longest, size)
        if current and ((len(current) + 1) * longest_with > max_tokens or len(current) >= cap):
            batches.append(current)
            current, longest_with = [], size
        current.append(i)
        longest = longest_with
    if current:
        batches.append(current)
    return batches


def even_out(batches: list, world_size: int) -> list:
    """Split the batch with most sentences in two until ranks can get equal batch counts.

    Equal counts keep data-parallel ranks in lockstep (no rank waits forever in an all-reduce);
    halving a full batch also keeps it within the budget.
    """
    batches = list(batches)
    while len(batches) % world_size:
        largest = max(range(len(batches)), key=lambda b: len(batches[b]))
        if len(batches[largest]) < 2:
            n = sum(len(b) for b in batches)
            raise DataError(
                f"cannot give {world_size} ranks equal batch counts from {n} examples: use fewer ranks or more data"
            )
        half = len(batches[largest]) // 2
        batches[largest : largest + 1] = [batches[largest][:half], batches[largest][half:]]
    return batches

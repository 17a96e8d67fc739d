"""The training split's batches for the loop: padded (``batching.py``) or packed (``packing.py``).

One object answers the trainer's three questions, whichever ``data.batching`` says: this rank's plan
for an epoch (a pure function of seed, epoch and rank), a planned batch as tensors, and the first
padded batch of rank 0 (the profiling batch of the Admin init, the same on every rank).
"""

from __future__ import annotations

import logging

from tfx.config import DataConfig
from tfx.data import batching, packing
from tfx.data.batching import Batch
from tfx.data.corpus import EncodedSplit

log = logging.getLogger("tfx.train")


class TrainBatches:
    def __init__(self, split: EncodedSplit, data: DataConfig, seed: int, rank: int, world_size: int) -> None:
        self.split, self.data, self.seed, self.rank, self.world_size = split, data, seed, rank, world_size
        self.rows: tuple[int, int, int] | None = None  # packed: (rows per batch, source, target row length)
        if data.batching == "packed":
            src_len, tgt_len = packing.row_lengths(split, data.pack_length)
            self.rows = (packing.rows_per_batch(data.max_tokens, src_len, tgt_len), src_len, tgt_len)
            log.info("packed batches: %d rows x %d source / %d target tokens", *self.rows)

    @property
    def packed(self) -> bool:
        return self.rows is not None

    def epoch(self, epoch: int, rank: int | None = None) -> list:
        """This rank's planned batches of ``epoch`` (index lists; packed: lists of rows of indices)."""
        where = dict(seed=self.seed, epoch=epoch, rank=self.rank if rank is None else rank,
                     world_size=self.world_size)  # fmt: skip
        if self.rows is None:
            return batching.make_batches(self.split, self.data.max_tokens, self.data.max_sentences, **where)
        return packing.make_packed_batches(self.split, *self.rows, **where)

    def collate(self, planned: list) -> Batch:
        if self.rows is None:
            return batching.collate(self.split, planned)
        return packing.collate_packed(self.split, planned, *self.rows)

    def collate_group(self, planned: list, start: int, size: int, pin: bool) -> list[Batch]:
        """``size`` planned batches from ``start`` as tensors (``pin``: page-locked, for the GPU copy)."""
        group = [self.collate(p) for p in planned[start : start + size]]
        return [b.pin_memory() for b in group] if pin else group

    def first_padded(self) -> Batch:
        """Rank 0's first padded batch of epoch 1."""
        plan = batching.make_batches(self.split, self.data.max_tokens, self.data.max_sentences, seed=self.seed)
        return batching.collate(self.split, plan[0])

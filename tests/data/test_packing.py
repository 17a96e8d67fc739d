"""The packed-batch planner: every pair exactly once per epoch, rows within their buffers, one batch
shape per run on an IWSLT-like length mix, a plan that depends only on (seed, epoch). CPU, no model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.data.helpers import SHARED_DATA
from tfx.data import DataError, collate, make_batches
from tfx.data.corpus import EncodedSplit
from tfx.data.packing import collate_packed, make_packed_batches, row_lengths, rows_per_batch


def split_of_lengths(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> EncodedSplit:
    """Pairs with these token counts (ids are irrelevant to the planner; EOS last)."""
    src = [np.append(np.full(n - 1, 5), 3) for n in src_lengths]
    tgt = [np.append(np.full(n - 1, 6), 3) for n in tgt_lengths]
    return EncodedSplit(src, tgt, [""] * len(src), [""] * len(src))


def iwslt_like(n: int = 6000, seed: int = 0) -> EncodedSplit:
    """Lengths shaped like IWSLT'14 De-En BPE (median ~24 tokens, a tail past 150), targets near sources."""
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(3.1, 0.6, n).astype(int), 2, 220)
    tgt = np.clip((src * rng.normal(1.05, 0.15, n)).astype(int), 2, 230)
    return split_of_lengths(src, tgt)


def test_every_pair_lands_once_in_a_row_that_holds_it_and_ranks_get_equal_counts() -> None:
    split = iwslt_like(3000)
    src_len, tgt_len = row_lengths(split)
    rows = rows_per_batch(4096, src_len, tgt_len)
    plans = [make_packed_batches(split, rows, src_len, tgt_len, seed=3, epoch=2, rank=r, world_size=3)
             for r in range(3)]  # fmt: skip
    assert len({len(p) for p in plans}) == 1
    seen = [i for plan in plans for batch in plan for row in batch for i in row]
    assert sorted(seen) == list(range(len(split)))
    for batch in (b for plan in plans for b in plan):
        assert len(batch) <= rows
        for row in batch:
            assert split.src_sizes[row].sum() <= src_len and split.tgt_sizes[row].sum() <= tgt_len


def test_the_plan_depends_only_on_seed_and_epoch() -> None:
    split = iwslt_like(2000)
    args = (split, 8, *row_lengths(split))
    assert make_packed_batches(*args, seed=1, epoch=1) == make_packed_batches(*args, seed=1, epoch=1)
    assert make_packed_batches(*args, seed=1, epoch=1) != make_packed_batches(*args, seed=1, epoch=2)


def _shapes_and_fill(split: EncodedSplit, max_tokens: int) -> tuple[set, float, set]:
    src_len, tgt_len = row_lengths(split)
    rows = rows_per_batch(max_tokens, src_len, tgt_len)
    plan = make_packed_batches(split, rows, src_len, tgt_len)
    packed = [collate_packed(split, b, rows, src_len, tgt_len) for b in plan]
    shapes = {(tuple(b.src_tokens.shape), tuple(b.target.shape)) for b in packed}
    fill = sum(b.ntokens for b in packed) / sum(b.target.numel() for b in packed)
    padded = {(tuple(b.src_tokens.shape), tuple(b.target.shape))
              for b in (collate(split, ix) for ix in make_batches(split, max_tokens))}  # fmt: skip
    return shapes, fill, padded


def test_an_iwslt_like_epoch_has_one_batch_shape_where_padding_has_dozens() -> None:
    shapes, fill, padded = _shapes_and_fill(iwslt_like(), 4096)
    assert len(shapes) == 1 and len(padded) > 30  # 6,000 pairs; an IWSLT-sized epoch pads to ~400 shapes
    assert fill > 0.85, f"target buffers {fill:.1%} full"


def test_the_real_iwslt14_length_mix_gives_one_shape(shared_data: Path) -> None:
    folder = SHARED_DATA / "iwslt14_deen_fairseq_tok" / "bpe10k"
    if not folder.is_dir():
        pytest.skip(f"{folder} is not present")
    lengths = {lang: np.array([len(line.split()) + 1 for split in ("valid", "test")
                               for line in (folder / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()])
               for lang in ("de", "en")}  # fmt: skip
    shapes, fill, padded = _shapes_and_fill(split_of_lengths(lengths["de"], lengths["en"]), 4096)
    assert len(shapes) == 1 and len(padded) > 50 and fill > 0.8


def test_a_row_shorter_than_the_longest_pair_is_a_one_line_error() -> None:
    split = split_of_lengths(np.array([5, 40]), np.array([7, 9]))
    assert row_lengths(split) == (40, 16)
    with pytest.raises(DataError, match=r"data.pack_length=32 is shorter than the longest training sentence \(40"):
        row_lengths(split, pack_length=32)

"""make_batches / collate: token budget, determinism, data-parallel sharding, teacher-forcing shift."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.data.helpers import toy_config
from tfx.data import BOS, EOS, PAD, Batch, DataError, EncodedSplit, collate, make_batches, prepare_data
from tfx.data.batching import _group_in_order, group_by_budget


@pytest.fixture(scope="module")
def train(tmp_path_factory) -> EncodedSplit:
    return prepare_data(toy_config(tmp_path_factory.mktemp("b")), splits=("train",)).splits["train"]


def plain(plan: list) -> list[list[int]]:
    """A plan (arrays of indices) as lists, to compare plans with ``==``."""
    return [[int(i) for i in batch] for batch in plan]


def cost(split: EncodedSplit, batch: list[int]) -> int:
    return len(batch) * int(max(max(split.src_sizes[i], split.tgt_sizes[i]) for i in batch))


def test_batches_respect_max_tokens_and_max_sentences(train):
    batches = make_batches(train, max_tokens=200)
    assert all(cost(train, b) <= 200 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(len(train)))
    assert max(len(b) for b in make_batches(train, max_tokens=10_000, max_sentences=7)) == 7


def test_example_longer_than_budget_gets_its_own_batch(train):
    batches = make_batches(train, max_tokens=5)
    assert sorted(i for b in batches for i in b) == list(range(len(train)))
    assert all(len(b) == 1 for b in batches if cost(train, b) > 5)


def test_order_is_deterministic_per_seed_and_epoch(train):
    def plan(**kw) -> list[list[int]]:
        return plain(make_batches(train, 300, **kw))

    assert plan(seed=1, epoch=1) == plan(seed=1, epoch=1)
    assert plan(seed=1, epoch=1) != plan(seed=1, epoch=2)
    assert plan(seed=1, epoch=1) != plan(seed=2, epoch=1)
    assert plan(shuffle=False) == plan(shuffle=False, seed=5, epoch=9)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_get_disjoint_equal_shares_covering_every_example(train, world_size):
    for max_tokens in (150, 173, 400):  # different batch counts, divisible or not
        shares = [
            make_batches(train, max_tokens, seed=3, epoch=2, rank=r, world_size=world_size) for r in range(world_size)
        ]
        assert len({len(share) for share in shares}) == 1
        seen = [i for share in shares for b in share for i in b]
        assert sorted(seen) == list(range(len(train)))
        assert all(cost(train, b) <= max_tokens for share in shares for b in share)


def test_collate_pads_and_shifts(train):
    indices = [0, 5, 9]
    batch = collate(train, indices)
    assert isinstance(batch, Batch) and batch.indices == indices
    lengths = [len(train.tgt[i]) for i in indices]
    assert batch.target.shape == batch.prev_output_tokens.shape == (3, max(lengths))
    assert batch.src_tokens.shape == (3, max(len(train.src[i]) for i in indices))
    assert batch.src_tokens.dtype == batch.target.dtype == torch.int64
    assert batch.src_lengths.tolist() == [len(train.src[i]) for i in indices]
    assert batch.ntokens == sum(lengths) == int(batch.target.ne(PAD).sum())
    for row, i in enumerate(indices):
        tgt, n = train.tgt[i], lengths[row]
        assert batch.target[row, :n].tolist() == tgt.tolist() and tgt[-1] == EOS
        assert batch.prev_output_tokens[row, :n].tolist() == [BOS, *tgt[:-1].tolist()]
        assert batch.prev_output_tokens[row, n:].eq(PAD).all() and batch.target[row, n:].eq(PAD).all()
        assert np.array_equal(batch.src_tokens[row, : len(train.src[i])].numpy(), train.src[i])


def test_collate_writes_every_decoder_input_cell(train, monkeypatch):
    """Scratch memory from ``np.empty*`` often still holds an earlier batch's BOS column, which hid a
    ``prev[:, 1] = BOS`` mistake; filled with a sentinel here, any cell collate forgets shows up."""
    sentinel = 99
    real_empty_like = np.empty_like
    monkeypatch.setattr(
        np, "empty_like", lambda a, *args, **kw: np.full_like(real_empty_like(a, *args, **kw), sentinel)
    )
    batch = collate(train, [0, 5, 9])
    expected = torch.full_like(batch.target, PAD)
    for row, i in enumerate(batch.indices):
        tgt = torch.from_numpy(train.tgt[i])
        expected[row, : len(tgt)] = torch.cat([torch.tensor([BOS]), tgt[:-1]])
    assert torch.equal(batch.prev_output_tokens, expected)


def test_batch_moves_between_devices(train):
    batch = collate(train, [1, 2])
    moved = batch.to("cpu")
    assert torch.equal(moved.target, batch.target) and moved.ntokens == batch.ntokens
    if torch.cuda.is_available():
        assert batch.pin_memory().src_tokens.is_pinned()


def test_batch_to_and_pin_memory_copy_every_tensor_with_the_right_flags(train, monkeypatch):
    """Tensor.to / pin_memory recorded (CPU has no pinned memory): every tensor goes through them,
    and ``to`` is blocking unless asked, since a non-blocking copy back to the host may be read early."""
    batch = collate(train, [1, 2])
    calls = []
    monkeypatch.setattr(torch.Tensor, "to", lambda t, device, **kw: calls.append(("to", device, kw)) or t.clone())
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: calls.append(("pin",)) or t.clone())
    tensors = sum(isinstance(v, torch.Tensor) for v in vars(batch).values())
    moved = batch.to("meta")
    assert calls == [("to", "meta", {"non_blocking": False})] * tensors
    calls.clear()
    batch.to("meta", non_blocking=True)
    assert calls == [("to", "meta", {"non_blocking": True})] * tensors
    calls.clear()
    pinned = batch.pin_memory()
    assert calls == [("pin",)] * tensors
    for copy in (moved, pinned):
        assert torch.equal(copy.target, batch.target) and copy.indices == batch.indices
        assert copy.ntokens == batch.ntokens


def split_of(lengths: list[tuple[int, int]]) -> EncodedSplit:
    src = [np.full(s, 7, dtype=np.int32) for s, _ in lengths]
    tgt = [np.full(t, 8, dtype=np.int32) for _, t in lengths]
    return EncodedSplit(src, tgt, [""] * len(lengths), [""] * len(lengths))


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30)), min_size=1, max_size=60),
    max_tokens=st.integers(1, 200),
    max_sentences=st.none() | st.integers(1, 8),
    world_size=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    epoch=st.integers(1, 5),
)
def test_batching_properties(lengths, max_tokens, max_sentences, world_size, seed, epoch):
    """Every example on exactly one rank, equal batch counts, the budget and sentence cap respected
    (an over-long example alone), and the same plan for the same (seed, epoch)."""
    split = split_of(lengths)
    plan = lambda r: make_batches(split, max_tokens, max_sentences, True, seed, epoch, r, world_size)  # noqa: E731
    try:
        shares = [plan(r) for r in range(world_size)]
    except DataError:  # only when too few examples to give every rank a batch
        assert len(split) % world_size != 0
        return
    assert sorted(i for share in shares for b in share for i in b) == list(range(len(split)))
    assert len({len(share) for share in shares}) == 1
    for b in (b for share in shares for b in share):
        assert len(b) and (cost(split, b) <= max_tokens or len(b) == 1)
        assert max_sentences is None or len(b) <= max_sentences
    assert [plain(plan(r)) for r in range(world_size)] == [plain(share) for share in shares]


def test_collate_lengths_are_int64(train):
    batch = collate(train, [0, 3])
    assert batch.src_lengths.dtype == batch.prev_output_tokens.dtype == torch.int64


def test_batch_to_moves_every_tensor(train):
    moved = collate(train, [1, 2]).to("meta")
    assert all(t.device.type == "meta" for t in (moved.src_tokens, moved.src_lengths, moved.prev_output_tokens,
                                                 moved.target))  # fmt: skip
    assert moved.ntokens > 0 and moved.indices == [1, 2]


def test_defaults_and_rank_check(train):
    assert plain(make_batches(train, 300)) == plain(make_batches(train, 300, seed=1, epoch=1))
    with pytest.raises(ValueError, match=r"rank=2 must be in \[0, world_size=2\)"):
        make_batches(train, 300, rank=2, world_size=2)


def test_budget_is_filled_exactly():
    """Equal sizes 5 and a budget of 20: batches of exactly 4 (a batch may reach the budget)."""
    batches = make_batches(split_of([(5, 5)] * 12), max_tokens=20, shuffle=False)
    assert sorted(len(b) for b in batches) == [4, 4, 4]


def test_ties_are_shuffled_between_epochs():
    """Same-size examples are grouped differently each epoch, not only the batch order."""
    split = split_of([(5, 5)] * 40)
    epochs = [{frozenset(b) for b in make_batches(split, 20, seed=1, epoch=e)} for e in (1, 2)]
    assert epochs[0] != epochs[1]


def test_even_out_splits_a_two_sentence_batch():
    """Sizes 5, budget 10: batches [2, 1]; three ranks need the pair split into two singletons."""
    shares = [make_batches(split_of([(5, 5)] * 3), 10, rank=r, world_size=3) for r in range(3)]
    assert [[len(b) for b in share] for share in shares] == [[1], [1], [1]]
    with pytest.raises(DataError, match="cannot give 2 ranks equal batch counts from 3 examples"):
        make_batches(split_of([(5, 5)] * 3), 5, world_size=2)


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=0, max_size=80),
    max_tokens=st.integers(1, 200),
    max_sentences=st.none() | st.integers(1, 8),
)
def test_budget_cuts_of_a_sorted_order_equal_the_sentence_by_sentence_loop(sizes, max_tokens, max_sentences):
    """The batch-at-a-time cut (``searchsorted`` over each window) is the greedy loop it replaced, exactly:
    the plans of every seed and epoch stay what they were."""
    sizes = np.array(sorted(sizes), dtype=np.int64)
    order = np.random.default_rng(0).permutation(len(sizes))
    by_order = np.empty_like(sizes)
    by_order[order] = sizes  # sizes[order] is sorted, as length_order makes it
    fast = group_by_budget(order, by_order, max_tokens, max_sentences)
    loop = _group_in_order(order, by_order[order], max_tokens, max_sentences or len(order))
    assert plain(fast) == loop

"""Packed rows against padded batches: the same sentences give the same loss and gradients (fp32, CPU,
relative 1e-5) for every residual kind; attention never crosses a sentence; padding stays finite."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import VOCAB, tiny_model
from tfx.data import PAD, collate
from tfx.data.corpus import EncodedSplit
from tfx.data.packing import collate_packed, pack_first_fit
from tfx.model import RESIDUALS
from tfx.model.packing import segment_mask
from tfx.optim.loss import label_smoothed_loss


def random_split(n: int = 14, seed: int = 0) -> EncodedSplit:
    """Pairs of 2-12 tokens (ids >= 4, EOS last) of unrelated source and target lengths."""
    rng = np.random.default_rng(seed)
    src = [np.append(rng.integers(4, VOCAB, rng.integers(1, 12)), 3) for _ in range(n)]
    tgt = [np.append(rng.integers(4, VOCAB, rng.integers(1, 12)), 3) for _ in range(n)]
    return EncodedSplit(src, tgt, [""] * n, [""] * n)


def loss_and_grads(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logits = model(batch.src_tokens, batch.prev_output_tokens, batch.packing)
    loss, _ = label_smoothed_loss(logits, batch.target, 0.1, PAD)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("norm", sorted(RESIDUALS))
def test_packed_rows_give_the_padded_loss_and_gradients(norm: str) -> None:
    torch.manual_seed(0)
    model = tiny_model(norm)
    split = random_split()
    padded = collate(split, list(range(len(split))))
    rows = pack_first_fit(np.arange(len(split)), split, src_len=24, tgt_len=24)
    assert len(rows) < len(split) and max(len(r) for r in rows) > 1  # several sentences share a row
    packed = collate_packed(split, rows, n_rows=len(rows) + 1, src_len=24, tgt_len=24)  # + an empty row
    assert packed.ntokens == padded.ntokens and sorted(packed.indices) == list(range(len(split)))
    loss_pad, grads_pad = loss_and_grads(model, padded)
    loss_packed, grads_packed = loss_and_grads(model, packed)
    torch.testing.assert_close(loss_packed, loss_pad, rtol=1e-5, atol=0)
    assert grads_packed.keys() == grads_pad.keys()
    names = list(grads_pad)
    flat_pad = torch.cat([grads_pad[n].flatten() for n in names])
    flat_packed = torch.cat([grads_packed[n].flatten() for n in names])
    assert (flat_packed - flat_pad).norm() <= 1e-5 * flat_pad.norm()  # the whole gradient, relative 1e-5
    for name in names:  # and each tensor, within fp32 summation-order noise
        if name.endswith("k_proj.bias"):  # exactly 0 in theory (softmax ignores a per-query shift): all noise
            continue
        difference = (grads_packed[name] - grads_pad[name]).norm()
        assert difference <= 1e-4 * grads_pad[name].norm(), f"{name}: {difference / grads_pad[name].norm():.2e}"


def test_a_sentence_does_not_see_its_row_neighbours() -> None:
    """Changing one sentence of a row changes no other sentence's logits."""
    torch.manual_seed(0)
    model = tiny_model().eval()
    split = random_split(6)
    rows = [list(range(3)), list(range(3, 6))]
    first = collate_packed(split, rows, 2, 40, 40)
    split.src[1] = np.append(np.full(len(split.src[1]) - 1, 7), 3)
    split.tgt[1] = np.append(np.full(len(split.tgt[1]) - 1, 9), 3)
    second = collate_packed(split, rows, 2, 40, 40)
    with torch.no_grad():
        a = model(first.src_tokens, first.prev_output_tokens, first.packing)
        b = model(second.src_tokens, second.prev_output_tokens, second.packing)
    segments = first.packing.tgt_segments
    other = (segments != 2) & (segments != 0)  # the real tokens of every other sentence (sentence 1: row 0, segment 2)
    other[1] = segments[1] != 0
    torch.testing.assert_close(a[other], b[other], rtol=0, atol=0)
    changed = (segments == 2) & (torch.arange(2)[:, None] == 0)
    assert not torch.equal(a[changed], b[changed])


def test_segment_masks_keep_to_the_sentence_and_give_padding_a_key() -> None:
    seg = torch.tensor([[1, 1, 2, 2, 2, 0]])
    causal = segment_mask(seg, seg, causal=True)[0, 0]
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1],
    ], dtype=torch.bool)  # fmt: skip
    assert torch.equal(causal, expected)
    full = segment_mask(seg, torch.tensor([[2, 1, 1, 0]]))[0, 0]
    assert torch.equal(full[0], torch.tensor([0, 1, 1, 0], dtype=torch.bool))
    assert full.any(-1).all()  # every query has a key: no NaN from an empty softmax

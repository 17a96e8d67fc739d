from __future__ import annotations

import functools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.conftest import PAD, VOCAB, random_batch, tiny_model
from tfx.init import apply_init
from tfx.model import Transformer, has_layer_norm
from tfx.model.attention import KVCache
from tfx.model.transformer import sinusoidal_table


@pytest.mark.parametrize("norm", ["none", "post", "pre"])
def test_shapes_and_norm_modules(norm: str) -> None:
    model = tiny_model(norm, enc=2, dec=3)
    src, tgt = random_batch()
    assert model(src, tgt).shape == (3, 6, VOCAB)
    n_ln = sum(isinstance(m, nn.LayerNorm) for m in model.modules())
    expected = {"none": 0, "post": 2 * 2 + 3 * 3, "pre": 2 * 2 + 3 * 3 + 2}[norm]
    assert n_ln == expected
    assert has_layer_norm(model) == (norm != "none")


def test_padding_does_not_change_real_positions() -> None:
    torch.manual_seed(0)
    model = tiny_model().eval().double()
    src, tgt = random_batch(b=1, s=5, t=4)
    src_padded = torch.cat([src, torch.full((1, 3), PAD)], dim=1)
    tgt_padded = torch.cat([tgt, torch.full((1, 2), PAD)], dim=1)
    out = model(src, tgt)
    out_padded = model(src_padded, tgt_padded)[:, :4]
    torch.testing.assert_close(out, out_padded, atol=1e-10, rtol=1e-10)


def test_causal_mask_no_future_leakage() -> None:
    torch.manual_seed(0)
    model = tiny_model().eval()
    src, tgt = random_batch()
    changed = tgt.clone()
    changed[:, 4:] = torch.randint(4, VOCAB, changed[:, 4:].shape)
    torch.testing.assert_close(model(src, tgt)[:, :4], model(src, changed)[:, :4])
    assert not torch.allclose(model(src, tgt)[:, 4:], model(src, changed)[:, 4:])


@pytest.mark.parametrize(("norm", "capacity"), [("none", 0), ("post", 6), ("pre", 2)])
def test_kv_cached_steps_equal_full_forward(norm: str, capacity: int) -> None:
    """Capacity 6 fits every step, 0 and 2 make the preallocated buffers grow."""
    torch.manual_seed(0)
    model = tiny_model(norm, enc=2, dec=3).eval()
    apply_init(model, "xavier")
    model.double()  # float64 so that any mismatch is a bug, not rounding
    src, tgt = random_batch()
    full = model(src, tgt)  # (B, T, V)
    enc = model.encode(src)
    state = model.new_decoder_state(capacity)
    steps = [model.decode_step(tgt[:, t : t + 1], enc, state) for t in range(tgt.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("order", [[2, 0, 1], [1, 1]])
def test_reorder_follows_beam(order: list[int]) -> None:
    """Reorder a half-filled preallocated cache (and shrink it to 2 rows), then keep decoding."""
    torch.manual_seed(0)
    model = tiny_model().eval().double()
    src, tgt = random_batch()
    enc = model.encode(src)
    state = model.new_decoder_state(capacity=6)
    model.decode_step(tgt[:, :1], enc, state)
    model.decode_step(tgt[:, 1:2], enc, state)
    rows = torch.tensor(order)
    state.reorder(rows, cross=rows)
    enc_reordered = type(enc)(enc.hidden[rows], enc.padding_mask[rows])
    step = model.decode_step(tgt[rows, 2:3], enc_reordered, state)
    torch.testing.assert_close(step, model(src[rows], tgt[rows, :3])[:, -1], atol=1e-10, rtol=1e-10)


def test_kv_cache_writes_in_place_and_reorders_only_what_is_filled() -> None:
    """Appending writes into the one preallocated buffer (no per-step copy of the prefix)."""
    cache = KVCache(capacity=4)
    steps = [torch.full((2, 1, 1, 3), float(i)) for i in range(3)]
    k, _ = cache.append(steps[0], -steps[0])
    buffer = cache.k
    for x in steps[1:]:
        k, v = cache.append(x, -x)
    assert cache.k is buffer and k.shape == (2, 1, 3, 3) and k.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(v, -torch.cat(steps, dim=2))
    cache.k[1, :3] += 10.0  # tell the two rows apart (buffers are (N, steps, H, Dh))
    cache.reorder(torch.tensor([1, 1, 0]))
    k, _ = cache.keys_values()
    assert cache.k.shape == (3, 4, 1, 3) and cache.length == 3
    torch.testing.assert_close(k[2], torch.cat(steps, dim=2)[0])
    torch.testing.assert_close(k[0], k[1])
    k, _ = cache.append(torch.zeros(3, 1, 2, 3), torch.zeros(3, 1, 2, 3))  # past capacity: grows
    assert k.shape == (3, 1, 5, 3) and cache.steps_allocated >= 5
    torch.testing.assert_close(k[2, :, :3], torch.cat(steps, dim=2)[0])


def test_embedding_sharing() -> None:
    tied = tiny_model(share_decoder_embeddings=True)
    assert tied.decoder.output_projection is None and not tied.embeddings_shared
    untied = tiny_model(share_decoder_embeddings=False)
    assert untied.decoder.output_projection is not None
    joint = tiny_model(share_all_embeddings=True)
    assert joint.embeddings_shared and joint.decoder.output_weight() is joint.encoder.embedding.embed.weight


def test_activation_checkpointing_same_gradients() -> None:
    torch.manual_seed(0)
    plain = tiny_model()
    ckpt = tiny_model(checkpoint_activations=True)
    ckpt.load_state_dict(plain.state_dict())
    src, tgt = random_batch()
    for model in (plain, ckpt):
        model(src, tgt).square().mean().backward()
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_200_plus_200_layers_forward_backward() -> None:
    model = tiny_model(enc=200, dec=200, d=8, checkpoint_activations=True)
    apply_init(model, "tfixup")
    src, tgt = random_batch(b=2, s=5, t=4)
    loss = model(src, tgt).float().logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss)
    grads = [layer.ffn.fc2.weight.grad for layer in (*model.encoder.layers, *model.decoder.layers)]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def formula_positions(n: int, d: int) -> torch.Tensor:
    """fairseq's table written out: channel i < d/2 is sin(p * 10000^(-i/(d/2-1))), channel d/2+i its cos."""
    half = d // 2
    table = torch.zeros(n, d, dtype=torch.float64)
    for p in range(n):
        for i in range(half):
            angle = p * 10000.0 ** (-i / (half - 1))
            table[p, i], table[p, half + i] = math.sin(angle), math.cos(angle)
    return table


@pytest.mark.parametrize("d", [8, 32, 33])
def test_sinusoidal_table_matches_the_formula(d: int) -> None:
    table = sinusoidal_table(64, d)
    assert table.shape == (64, d)
    torch.testing.assert_close(table.double(), formula_positions(64, d), rtol=0, atol=2e-5)
    half = d // 2
    assert table[0, :half].abs().max() == 0 and torch.equal(table[0, half : 2 * half], torch.ones(half))
    assert table[1, 0].item() == pytest.approx(math.sin(1.0)) and table[1, half].item() == pytest.approx(math.cos(1.0))
    assert table[1, half - 1].item() == pytest.approx(math.sin(1e-4), rel=1e-4)  # slowest frequency: 1/10000


def test_token_embedding_scales_by_sqrt_d_and_adds_positions() -> None:
    d = 32
    model = tiny_model(d=d).eval()
    tokens = torch.tensor([[5, 9, PAD], [7, 7, 11]])
    for embedding in (model.encoder.embedding, model.decoder.embedding):
        for offset in (0, 4):
            expected = (
                math.sqrt(d) * embedding.embed.weight[tokens].double() + formula_positions(offset + 3, d)[offset:]
            )
            out = embedding(tokens, offset=offset) if offset else embedding(tokens)  # offset defaults to 0
            torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-4)


def test_token_embedding_accepts_exactly_max_positions() -> None:
    embedding = tiny_model(max_positions=6).encoder.embedding
    assert embedding(torch.full((1, 6), 5)).shape == (1, 6, 32)
    assert embedding(torch.full((1, 2), 5), offset=4).shape == (1, 2, 32)
    with pytest.raises(ValueError, match="sequence of 7 tokens exceeds model.max_positions=6"):
        embedding(torch.full((1, 3), 5), offset=4)


@functools.cache
def double_model(norm: str) -> Transformer:
    torch.manual_seed(0)
    model = tiny_model(norm, enc=2, dec=2).eval()
    apply_init(model, "xavier")
    return model.double()


@settings(max_examples=30, deadline=None)
@given(
    norm=st.sampled_from(["none", "post", "pre"]),
    src_lens=st.lists(st.integers(1, 12), min_size=1, max_size=3),
    tgt_len=st.integers(1, 14),
    seed=st.integers(0, 2**16),
)
def test_kv_cache_equals_full_forward_for_random_lengths(norm: str, src_lens: list[int], tgt_len: int, seed: int):
    """Step-by-step decoding with the KV cache gives the full forward's logits at every position,
    whatever the source lengths (right padding) and target length."""
    model = double_model(norm)
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (len(src_lens), max(src_lens)), generator=g)
    for row, n in enumerate(src_lens):
        src[row, n:] = PAD
    tgt = torch.randint(4, VOCAB, (len(src_lens), tgt_len), generator=g)
    with torch.no_grad():
        full = model(src, tgt)  # (B, T, V)
        enc, state = model.encode(src), model.new_decoder_state()
        steps = [model.decode_step(tgt[:, t : t + 1], enc, state) for t in range(tgt_len)]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-10, rtol=1e-10)

"""Small pieces of tfx.model checked exactly: the KV cache's bookkeeping, constructor defaults and
refusals, PAD embeddings, activation checkpointing on both stacks."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import tfx.model.transformer as transformer_mod
from tests.conftest import PAD, VOCAB, random_batch, tiny_model
from tfx.config import ModelConfig
from tfx.model import RESIDUALS, MultiheadAttention, Transformer, build_model
from tfx.model.attention import KVCache
from tfx.model.residual import Residual, residual_class


def steps(*lengths: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, t, 4, generator=g) for t in lengths]  # (N, H, t, Dh)


def test_static_cache_keeps_the_source_length_and_reorders_rows() -> None:
    k = torch.arange(2 * 3 * 5 * 4, dtype=torch.float).view(2, 3, 5, 4)  # 5 source steps, head dim 4
    cache = KVCache()
    cache.store(k, -k)
    assert cache.length == 5
    keys, values = cache.keys_values()
    assert torch.equal(keys, k) and torch.equal(values, -k)
    cache.reorder(torch.tensor([1, 0]))
    assert torch.equal(cache.keys_values()[0], k[[1, 0]])


def test_growing_cache_appends_doubles_and_reorders_the_valid_part() -> None:
    """Capacity 3: 2 + 2 steps grow it to 4, one more doubles it to 8; every read is the concatenation."""
    cache = KVCache(capacity=3)
    parts = steps(2, 2, 1)
    for i, part in enumerate(parts):
        keys, values = cache.append(part, 2 * part)
        assert torch.equal(keys, torch.cat(parts[: i + 1], dim=2)) and torch.equal(values, 2 * keys)
    assert (cache.length, cache.steps_allocated) == (5, 8)
    cache.reorder(torch.tensor([1, 0]))
    assert torch.equal(cache.keys_values()[0], torch.cat(parts, dim=2)[[1, 0]])
    assert cache.steps_allocated == 8  # still room to append without a copy


def test_refusals_name_the_setting() -> None:
    kinds = r"\['admin', 'deepnorm', 'derf', 'dyt', 'fixup', 'none', 'post', 'pre', 'rezero'\]"
    with pytest.raises(ValueError, match=rf"^model\.norm='mid': use one of {kinds}$"):
        residual_class("mid")
    with pytest.raises(ValueError, match=r"^d_model=30 must be divisible by heads=4$"):
        MultiheadAttention(30, 4)


def test_a_kinds_options_live_in_the_config_only() -> None:
    """A kind's own setting has its one default where the kind declares it: a field of its ``Options`` dataclass
    (Derf's alpha), or, for the two from before ``model.norm_options``, a ``ModelConfig`` field it names in
    ``config_fields`` (``dyt_alpha``). Either way its constructor and ``final_module`` take it as a keyword argument
    without a default of their own."""
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    for cls in RESIDUALS.values():
        declared = [f.name for f in dataclasses.fields(cls.Options)] if cls.Options is not None else []
        assert not set(declared) & set(cls.config_fields), cls.__name__
        for name in cls.config_fields:
            assert name in fields, f"{cls.__name__}.config_fields names {name}, which is no ModelConfig field"
        for name in [*cls.config_fields, *declared]:
            for method in (cls.__init__, cls.final_module):
                param = inspect.signature(method).parameters.get(name)
                if param is None:  # the base final_module takes **options
                    assert method.__func__ is Residual.final_module.__func__, (cls.__name__, name)
                    continue
                assert param.kind is param.KEYWORD_ONLY and param.default is param.empty, (cls.__name__, name)
    assert set(inspect.signature(Transformer.__init__).parameters) == {"self", "cfg", "vocab_size", "pad_id"}


def test_an_old_checkpoints_model_fields_rebuild_with_the_defaults_of_newer_ones() -> None:
    """A checkpoint's ``config["model"]`` written before a field existed lacks it: the default stands in; a field
    the schema does not know is refused by name."""
    fields = dataclasses.asdict(ModelConfig(norm="rezero", d_model=16, heads=2))
    del fields["rezero_shared"], fields["dyt_alpha"], fields["norm_options"]
    assert ModelConfig.from_fields(fields) == ModelConfig(norm="rezero", d_model=16, heads=2)
    with pytest.raises(ValueError, match=r"unknown fields \['depth'\]"):
        ModelConfig.from_fields({**fields, "depth": 3})


def test_build_model_takes_a_config_or_its_dict() -> None:
    cfg = ModelConfig(encoder_layers=1, decoder_layers=2, d_model=16, ffn_dim=24, heads=2, max_positions=40)
    for given in (cfg, dataclasses.asdict(cfg)):
        model = build_model(given, VOCAB, PAD)
        assert (len(model.encoder.layers), len(model.decoder.layers), model.vocab_size) == (1, 2, VOCAB)
        assert model.pad_id == model.encoder.pad_id == PAD
        assert model.decoder.embedding.positions.shape == (40, 16)


def test_pad_embeddings_are_zero_and_get_no_gradient() -> None:
    """Untied embeddings (a tied one also gets the output layer's PAD-logit gradient)."""
    torch.manual_seed(0)
    model = tiny_model(share_decoder_embeddings=False)
    src, prev = random_batch()
    model(src, prev).sum().backward()
    for embed in (model.encoder.embedding.embed, model.decoder.embedding.embed):
        assert embed.weight[PAD].eq(0).all() and embed.weight.grad[PAD].eq(0).all()
    assert embed.weight.grad.ne(0).any()


def test_activation_checkpointing_wraps_every_layer_of_both_stacks(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[type] = []
    real = transformer_mod.checkpoint
    monkeypatch.setattr(
        transformer_mod, "checkpoint", lambda layer, *a, **kw: calls.append(type(layer)) or real(layer, *a, **kw)
    )
    model = tiny_model(enc=2, dec=3)
    model.set_activation_checkpointing(True)
    src, prev = random_batch()
    model(src, prev).sum().backward()
    assert [c.__name__ for c in calls] == ["EncoderLayer"] * 2 + ["DecoderLayer"] * 3
    calls.clear()
    with torch.no_grad():
        model(src, prev)  # nothing to recompute without gradients
    assert calls == []


def test_a_decode_step_caches_the_encoder_keys_once_per_layer() -> None:
    """Cross-attention keys and values are computed at the first step and reused after."""
    model = tiny_model(dec=3).eval()
    src, tgt = random_batch()
    state = model.new_decoder_state()
    encoder_out = model.encode(src)
    with torch.no_grad():
        model.decode_step(tgt[:, :1], encoder_out, state)
        cached = [layer["cross"].keys_values()[0] for layer in state.layers]
        model.decode_step(tgt[:, 1:2], encoder_out, state)
    assert [layer["cross"].length for layer in state.layers] == [src.size(1)] * 3
    reused = [layer["cross"].keys_values()[0].data_ptr() for layer in state.layers]
    assert reused == [k.data_ptr() for k in cached]
    assert [layer["self"].length for layer in state.layers] == [2] * 3


def test_attention_dropout_acts_in_training_only() -> None:
    attn = MultiheadAttention(16, 2, dropout=0.5)
    plain = MultiheadAttention(16, 2)
    plain.load_state_dict(attn.state_dict())
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    assert not torch.allclose(attn.train()(x, x), plain(x, x))  # a dropout mask in training
    torch.testing.assert_close(attn.eval()(x, x), plain(x, x))  # none in evaluation


def test_positions_are_not_saved_in_the_state_dict() -> None:
    """The sinusoid table is rebuilt from max_positions, so checkpoints stay loadable when it changes."""
    assert not any("positions" in key for key in tiny_model().state_dict())


@pytest.mark.parametrize("g", [2, 3])
def test_beams_sharing_a_source_row_attend_as_if_it_were_copied(g: int) -> None:
    """g query rows per key row (the beams of one sentence) give what expanding the keys would give."""
    attn = MultiheadAttention(16, 4).double().eval()
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2 * g, 2, 16, generator=gen, dtype=torch.double)  # (B*g, T, D)
    source = torch.randn(2, 5, 16, generator=gen, dtype=torch.double)  # (B, S, D)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    grouped = attn(query, source, key_padding_mask=pad)
    copied = attn(query, source.repeat_interleave(g, 0), key_padding_mask=pad.repeat_interleave(g, 0))
    torch.testing.assert_close(grouped, copied, atol=1e-12, rtol=1e-12)
    with pytest.raises(ValueError, match=f"^{2 * g - 1} query rows cannot share 2 key rows$"):
        attn(query[: 2 * g - 1], source)
    with pytest.raises(ValueError, match=f"^{2 * g} query rows cannot share 2 key rows under a causal mask$"):
        attn(query, source, causal=True)


def test_repeated_reorders_reuse_the_spare_buffers_and_keep_every_row() -> None:
    """Same-size reorders swap two buffer pairs (no allocation); a shrink keeps using them; values follow."""
    cache = KVCache(capacity=6)
    parts = steps(1, 1)
    for part in parts:
        cache.append(part, -part)
    history = torch.cat(parts, dim=2)  # (2, 3, 2, 4)
    first = cache.k
    cache.reorder(torch.tensor([1, 0]))
    second = cache.k
    cache.reorder(torch.tensor([1, 1]))
    assert cache.k.data_ptr() == first.data_ptr() and second.data_ptr() != first.data_ptr()
    history = history[[1, 0]][[1, 1]]
    torch.testing.assert_close(cache.keys_values()[0], history)
    cache.reorder(torch.tensor([0]))  # a sentence finished: one row left, in the spare's first row
    assert cache.k.data_ptr() == second.data_ptr()
    new = steps(1, seed=1)[0][:1]
    keys, values = cache.append(new, -new)
    torch.testing.assert_close(keys, torch.cat([history[:1], new], dim=2))
    torch.testing.assert_close(values, -keys)


def test_reorders_that_fan_rows_out_keep_every_row() -> None:
    """Beam search's first reorder fans 2 rows out to 6 (a long buffer, few rows); the next reorders,
    with a spare holding only 2 rows, must still keep all 6."""
    cache = KVCache(capacity=16)
    parts = steps(1, 1)
    for part in parts:
        cache.append(part, -part)
    history = torch.cat(parts, dim=2)  # (2, 3, 2, 4)
    for order in ([0, 0, 0, 1, 1, 1], [5, 4, 3, 2, 1, 0], [1, 1, 0, 0, 2, 2]):
        cache.reorder(torch.tensor(order))
        history = history[order]
        keys, values = cache.keys_values()
        torch.testing.assert_close(keys, history)
        torch.testing.assert_close(values, -history)
